"""The Kubernetes API double over real HTTP, continued: discovery and DRA resources, DaemonSets, time scaling,
containers that exit on SIGTERM, loading a snapshot directory, and concurrency (fixtures and builders from ``test_k8s_double``)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from rightsizer.testing.k8s import KubernetesDouble
from tests.integration.test_k8s_double import T0, TOKEN, api_client, double, http, node, pdb, pod

pytestmark = pytest.mark.integration

__all__ = ["double", "http"]  # the fixtures, re-used from test_k8s_double


# -------------------------------------------------------------------------------------- discovery and DRA


def resource_slice(name: str, node_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA H100"}}}],
        },
    }


def test_discovery_lists_resource_k8s_io_only_in_its_served_versions(
    double: KubernetesDouble, http: httpx.Client
) -> None:
    double.add_resource_slice(resource_slice("gpu-a-slice", "gpu-a"))
    double.set_resource_api_versions(["v1beta1", "v1beta2"])
    with api_client(double.base_url) as raw:
        groups = {g.name: g for g in client.ApisApi(raw).get_api_versions().groups}
        version = client.VersionApi(raw).get_code()

    assert [v.version for v in groups["resource.k8s.io"].versions] == ["v1beta2", "v1beta1"]
    assert groups["resource.k8s.io"].preferred_version.version == "v1beta2"
    assert {"apps", "policy", "authorization.k8s.io"} <= set(groups)
    assert (version.major, version.minor) == ("1", "33")
    beta1 = http.get(
        "/apis/resource.k8s.io/v1beta1/resourceslices", params={"fieldSelector": "spec.nodeName=gpu-a"}
    )
    assert beta1.json()["apiVersion"] == "resource.k8s.io/v1beta1"
    assert beta1.json()["items"][0]["spec"]["devices"][0]["basic"]["attributes"]["productName"]["string"] == (
        "NVIDIA H100"
    )
    assert http.get("/apis/resource.k8s.io/v1/resourceslices").status_code == 404

    double.set_resource_api_versions(None)

    assert "resource.k8s.io" not in {g["name"] for g in http.get("/apis").json()["groups"]}
    gone = http.get("/apis/resource.k8s.io/v1beta2/resourceslices")
    assert (gone.status_code, gone.json()["reason"]) == (404, "NotFound")


def test_resource_claims_convert_between_versions(double: KubernetesDouble, http: httpx.Client) -> None:
    double.set_resource_api_versions(["v1", "v1beta1"])
    double.add_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceClaim",
            "metadata": {"name": "train-gpu", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}},
        }
    )

    v1 = http.get("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train-gpu").json()
    beta = http.get("/apis/resource.k8s.io/v1beta1/resourceclaims").json()["items"][0]

    assert v1["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    ]
    assert beta["spec"]["devices"]["requests"] == [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]


def test_daemonsets_are_readable_and_not_writable(double: KubernetesDouble, http: httpx.Client) -> None:
    double.add_daemonset(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "dcgm-exporter", "namespace": "gpu-operator"},
            "spec": {"selector": {"matchLabels": {"app": "dcgm"}}, "template": {"spec": {"containers": []}}},
        }
    )
    with api_client(double.base_url) as raw:
        apps = client.AppsV1Api(raw)
        listed = apps.list_daemon_set_for_all_namespaces()
        read = apps.read_namespaced_daemon_set("dcgm-exporter", "gpu-operator")

    assert [d.metadata.name for d in listed.items] == ["dcgm-exporter"]
    assert read.metadata.generation == 1
    assert http.delete("/apis/apps/v1/namespaces/gpu-operator/daemonsets/dcgm-exporter").status_code == 405


# ------------------------------------------------------------------------------------------- time, loading


def test_time_scale_runs_grace_periods_faster_on_an_injected_clock() -> None:
    now = [T0]
    with KubernetesDouble(clock=lambda: now[0], time_scale=60) as double:
        double.add_node(node("gpu-a"))
        double.add_pod(pod("trainer", grace=600))
        httpx.delete(f"{double.base_url}/api/v1/namespaces/ml/pods/trainer")

        now[0] += 9.9  # 594 s of double time
        double.reap()
        alive = double.get_pod("ml", "trainer")
        now[0] += 0.1

        assert alive is not None
        assert double.get_pod("ml", "trainer") is None


@pytest.mark.parametrize(
    ("grace", "exit_s", "finalizer", "gone_after"),
    [
        (30, 2.0, False, 2.0),  # the containers exit on SIGTERM: the pod goes well before its deadline
        (30, None, False, 30.0),  # default: the containers use the whole grace period
        (1, 2.0, False, 1.0),  # the grace period still caps it (SIGKILL)
        (30, 2.0, True, None),  # a finalizer keeps it terminating whatever the containers do
    ],
)
def test_containers_that_exit_on_sigterm_let_the_pod_go_before_its_deletion_timestamp(
    grace: int, exit_s: float | None, finalizer: bool, gone_after: float | None
) -> None:
    now = [T0]
    with KubernetesDouble(clock=lambda: now[0], container_exit_seconds=exit_s) as double:
        double.add_node(node("gpu-a"))
        trainer = pod("trainer", grace=grace)
        if finalizer:
            trainer["metadata"]["finalizers"] = ["example.com/flush"]
        double.add_pod(trainer)
        httpx.delete(f"{double.base_url}/api/v1/namespaces/ml/pods/trainer")
        terminating = double.get_pod("ml", "trainer")
        assert terminating is not None
        # deletionTimestamp stays the deadline (now + grace), as the API server sets it
        assert terminating["metadata"]["deletionGracePeriodSeconds"] == grace
        deadline = datetime.fromtimestamp(T0 + grace, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert terminating["metadata"]["deletionTimestamp"] == deadline

        if gone_after is None:
            now[0] += 3600
            assert double.get_pod("ml", "trainer") is not None
            return
        now[0] = T0 + gone_after - 0.1
        assert double.get_pod("ml", "trainer") is not None
        now[0] = T0 + gone_after
        assert double.get_pod("ml", "trainer") is None


def test_from_snapshot_dir_loads_kubectl_lists(tmp_path: Path) -> None:
    def write(name: str, items: list[dict[str, Any]]) -> None:
        (tmp_path / name).write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    write("nodes.json", [node("gpu-a"), node("gpu-b")])
    write("pods.json", [pod("web-0", labels={"app": "web"}), pod("web-1", "gpu-b", labels={"app": "web"})])
    write("pdbs.json", [pdb("web", {"app": "web"}, minAvailable=1)])
    beta = resource_slice("gpu-a-slice", "gpu-a")
    beta["apiVersion"] = "resource.k8s.io/v1beta1"
    beta["spec"]["devices"] = [{"name": "gpu-0", "basic": {"attributes": {}}}]
    write("resourceslices.json", [beta])

    with KubernetesDouble.from_snapshot_dir(tmp_path, clock=lambda: T0) as double:
        served = httpx.get(f"{double.base_url}/apis/resource.k8s.io").json()
        budget = double.get_pdb("ml", "web")

        assert [n["metadata"]["name"] for n in double.list_nodes()] == ["gpu-a", "gpu-b"]
        assert [v["version"] for v in served["versions"]] == ["v1beta1"]
        assert budget is not None and budget["status"]["disruptionsAllowed"] == 1
        assert all(p["metadata"]["uid"] and p["metadata"]["resourceVersion"] for p in double.list_pods())

    (tmp_path / "resourceslices.json").unlink()
    without_dra = KubernetesDouble.from_snapshot_dir(tmp_path)
    with without_dra:
        groups = httpx.get(f"{without_dra.base_url}/apis").json()["groups"]
    assert "resource.k8s.io" not in {g["name"] for g in groups}


def test_concurrent_evictions_never_overspend_a_budget(double: KubernetesDouble) -> None:
    for index in range(8):
        double.add_pod(pod(f"web-{index}", labels={"app": "web"}))
    double.add_pdb(pdb("web", {"app": "web"}, maxUnavailable=2))

    def evict_raw(name: str) -> int:
        with httpx.Client(base_url=double.base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as session:
            body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
            return session.post(f"/api/v1/namespaces/ml/pods/{name}/eviction", json=body).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(evict_raw, [f"web-{index}" for index in range(8)]))

    assert sorted(codes) == [201, 201] + [429] * 6
