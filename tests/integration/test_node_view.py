"""Judge one node, read one node (issue 11 item 5): the drain's fresh assessment reads only its node.

GIVEN a cluster of many GPU nodes in the Kubernetes API double (real HTTP, the ClusterRole ``rightsizer``
of ``infra/k8s/rbac.yaml`` enforced) and DCGM series of some of them in a real, backfilled Prometheus,
WHEN the drain's assessor (``builders.build_assessor``: ``observe_node_live``) judges one node,
THEN it lists no Node or Pod without a field selector, reads budgets and claims of its pods' namespaces
only, every PromQL query it sends carries the node's matchers, the number of requests is the same for a
cluster twice the size — and its report is the report the whole cluster's observation gives that node,
for idle, busy, unknown, ambiguous and volume-pinned nodes.
"""

from __future__ import annotations

import dataclasses
import gc
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.prometheus import PrometheusClient
from rightsizer.config import Config
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import ENERGY, FB_FREE, FB_USED, GPU_UTIL, POWER, UP
from rightsizer.services import observe as live
from rightsizer.services.assess import PlanningAssessor
from rightsizer.testing.k8s import KubernetesDouble, RecordedRequest
from rightsizer.wiring import builders
from tests.builders import AT, WINDOW, claim_volume, exporter_pod, gpu_node, pdb, pod, pv, pvc

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.prometheus_server"]

RBAC = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "rbac.yaml"
JOB = "dcgm"
END = AT.timestamp()
Families = dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]]
#: Scrape targets named by the scrape config alone (neither the node's nor a pod's name or address).
OWN_NAMES = {8: "gpu8.dcgm.example"}
#: Reasons the drain re-checks itself (its budget slot); they depend on the other nodes by design.
BUDGET_CODES = ("disruption_budget_exhausted", "in_flight")


def name(i: int) -> str:
    return f"gpu-{i:04d}"


def node_ip(i: int) -> str:
    return f"10.0.{i // 250}.{i % 250 + 1}"


def exporter_ip(i: int) -> str:
    return f"10.1.{i // 250}.{i % 250 + 1}"


def series(
    families: Families,
    i: int,
    *,
    busy: bool,
    extra: dict[str, str] | None = None,
    scrape: int = 15,
    stopped: float = 0.0,
) -> None:
    """One A10G's DCGM series scraped every ``scrape`` s from node ``i``'s exporter (pod IP, port 9400);
    with ``stopped``, the exporter answers no scrape in the last ``stopped`` s before ``END`` (``up`` 0)."""
    labels = {
        "gpu": "0",
        "UUID": f"GPU-{i}",
        "modelName": "NVIDIA A10G",
        "Hostname": f"nvidia-dcgm-exporter-{i:05d}",
        "instance": f"{exporter_ip(i)}:9400",
        "job": JOB,
        **(extra or {}),
    }
    attempts = [round(END - WINDOW - 600 + 7 + scrape * k, 3) for k in range((WINDOW + 600) // scrape)]
    times = [t for t in attempts if t <= END - stopped]
    shapes = {
        GPU_UTIL: 85.0 if busy else 0.0,
        FB_USED: 15000.0 if busy else 300.0,
        FB_FREE: 7000.0 if busy else 21700.0,
        POWER: 180.0 if busy else 27.0,
    }
    for metric, value in shapes.items():
        families.setdefault(metric, []).append((labels, [(t, value) for t in times]))
    families.setdefault(ENERGY, []).append((labels, [(t, 9.8e10 + (t - times[0]) * 27_000.0) for t in times]))
    families.setdefault(UP, []).append(
        (
            {"instance": labels["instance"], "job": JOB},
            [(t, 1.0 if t <= END - stopped else 0.0) for t in attempts],
        )
    )


@pytest.fixture(scope="module")
def prometheus(prometheus_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.support.prometheus_server import openmetrics_lines, start_prometheus

    families: Families = {}
    series(families, 0, busy=False)  # idle
    series(families, 1, busy=True)  # busy
    # node 2's series also name node 7 (Hostname): ambiguous in the whole cluster's join
    series(families, 2, busy=False, extra={"Hostname": name(7)})
    series(families, 3, busy=False)  # idle, with a zonal volume (searched for another node)
    series(families, 7, busy=False)
    # node 5's exporter stopped answering 100 s before the window's end: stale at the 90 s bound its 15 s
    # scrapes set (up counted), fresh at the fixed 300 s a read without the target's up count would use
    series(families, 5, busy=False, stopped=100)
    # node 6's exporter runs on the host network and its scrape config names the target by the node's name
    # (instance "<node>:9400", Hostname "<node>"), neither a node nor a pod IP; stopped 100 s ago like node 5
    series(families, 6, busy=False, stopped=100, extra={"instance": f"{name(6)}:9400", "Hostname": name(6)})
    # node 8's target goes by a name the node does not know (a DNS name of the scrape config's own): its up
    # is found by the target its DCGM series name
    series(
        families, 8, busy=False, stopped=100, extra={"instance": f"{OWN_NAMES[8]}:9400", "Hostname": name(8)}
    )
    # node 4 has no series at all: unknown

    def write(path: Path) -> None:
        with path.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in openmetrics_lines(families))

    server = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("prom"), write_openmetrics=write)
    yield server.url
    server.stop()


def cluster_role(role: str) -> dict[str, Any]:
    docs = yaml.safe_load_all(RBAC.read_text())
    return next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role)


def fill(double: KubernetesDouble, nodes: int) -> None:
    """``nodes`` g5.2xlarge nodes, each with its exporter and two workload pods in one of three teams
    (each team with a PodDisruptionBudget); node 3's pod mounts a zonal EBS volume."""
    for i in range(nodes):
        zone = "us-east-1a" if i % 2 else "us-east-1b"
        double.add_node(
            gpu_node(
                name(i),
                instance_type="g5.2xlarge",
                gpus=1,
                ip=node_ip(i),
                labels={"topology.kubernetes.io/zone": zone},
            )
        )
        double.add_pod(exporter_pod(name(i), exporter_ip(i), name=f"nvidia-dcgm-exporter-{i:05d}"))
        team = f"team-{i % 3}"
        volumes = [claim_volume("data-3")] if i == 3 else None
        double.add_pod(pod(f"web-{i}", name(i), namespace=team, labels={"app": "web"}, volumes=volumes))
        double.add_pod(pod(f"batch-{i}", name(i), namespace=team, labels={"app": "batch"}))
    for t in range(3):
        double.add_pdb(pdb("web", f"team-{t}", {"app": "web"}, 1))
    double.add_pvc(pvc("data-3", "pv-ebs-3", namespace="team-0"))
    double.add_pv(pv("pv-ebs-3", affinity={"topology.kubernetes.io/zone": ["us-east-1a"]}))
    double.add_pod(pod("trainer-pending", None, namespace="team-1", gpus=1, phase="Pending"))


def world(nodes: int, url: str) -> tuple[KubernetesDouble, Config, live.Observers]:
    double = KubernetesDouble(seed=11, resource_api_versions=None)
    double.start()
    double.bind_cluster_role(cluster_role("rightsizer"))
    fill(double, nodes)
    cluster = KubernetesCluster.for_eks(
        double.base_url, EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None))
    )
    config = Config.model_validate(
        {"cluster": {"name": "prod", "region": "us-east-1"}, "prometheus": {"url": url, "job": JOB}}
    )
    observers = builders.live_observers(cluster, None, PrometheusClient(url))
    return double, config, observers


class RecordingTransport(httpx.HTTPTransport):
    """A real HTTP transport that keeps every PromQL expression it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode() or request.url.query.decode()))
        if "query" in form:
            self.queries.append(form["query"])
        return super().handle_request(request)


def comparable(report: NodeReport | None) -> dict[str, Any]:
    assert report is not None
    dump = report.model_dump()
    dump["reasons"] = [r for r in dump["reasons"] if not r.startswith(BUDGET_CODES)]
    return dump


def cluster_wide(requests: list[RecordedRequest]) -> list[str]:
    """Requests that read a collection of the whole cluster: a list of nodes, pods or any other kind
    across all namespaces without a field selector (GETs of one named object are fine)."""
    wide = []
    for r in requests:
        if r.method != "GET" or r.param("fieldSelector"):
            continue
        path = r.path
        if re.fullmatch(
            r"/api/v1/(nodes|pods|persistentvolumeclaims|persistentvolumes)", path
        ) or re.fullmatch(r"/apis/[^/]+/[^/]+/(poddisruptionbudgets|resourceclaims|resourceslices)", path):
            wide.append(f"{r.method} {path}?{r.query}")
    return wide


@pytest.mark.parametrize("node", [0, 1, 2, 3, 4, 5, 6, 8])
def test_one_node_is_judged_as_the_whole_cluster_judges_it_without_reading_the_cluster(
    prometheus: str, node: int
) -> None:
    double, config, observers = world(40, prometheus)
    try:
        policy = Policy(dry_run=False)
        # the whole cluster's read is the assessment's, under its own identity (rightsizer-read)
        double.bind_cluster_role(cluster_role("rightsizer-read"))
        full = PlanningAssessor(lambda at: live.observe_live(config, policy, observers, at), policy)
        expected = full.assess_node(name(node), AT + timedelta(seconds=30))
        double.bind_cluster_role(cluster_role("rightsizer"))
        transport = RecordingTransport()
        observers = builders.live_observers(
            observers.cluster, None, PrometheusClient(prometheus, transport=transport)
        )
        double.clear_requests()
        got = builders.build_assessor(config, policy, observers).assess_node(
            name(node), AT + timedelta(seconds=30)
        )
        # THEN the verdict and every reason and figure are those of the whole cluster's observation
        assert comparable(got) == comparable(expected)
        # AND nothing of the cluster beyond the node was listed
        requests = double.requests
        assert cluster_wide(requests) == []
        assert not [r for r in requests if r.status == 403]
        pod_lists = sorted(str(r.param("fieldSelector")) for r in requests if r.path == "/api/v1/pods")
        assert f"spec.nodeName={name(node)}" in pod_lists
        # AND every query reads the node's series only: each alternative names the node, its addresses or
        # the targets its series name
        assert len(transport.queries) >= 13
        for query in transport.queries:
            for selector in re.findall(r"\{([^}]*)\}", query):
                assert (
                    f'"{name(node)}"' in selector
                    or re.escape(exporter_ip(node)).replace("\\", "\\\\") in selector
                    or OWN_NAMES.get(node, "-") in selector.replace("\\", "")  # its targets' up, by name
                )
    finally:
        double.stop()


def test_the_cases_differ_so_the_comparison_is_not_vacuous(prometheus: str) -> None:
    double, config, observers = world(40, prometheus)
    try:
        policy = Policy(dry_run=False)
        assessor = builders.build_assessor(config, policy, observers)
        at = AT + timedelta(seconds=30)
        reports = {i: assessor.assess_node(name(i), at) for i in (0, 1, 2, 3, 4, 5, 6, 8)}
        assert all(r is not None for r in reports.values())
        idle, busy, ambiguous, zonal, silent, stopped, named, other = (
            reports[i] for i in (0, 1, 2, 3, 4, 5, 6, 8)
        )
        assert idle is not None and idle.gpu_activity_max_pct == 0.0 and idle.coverage == 1.0
        # the unscheduled GPU pod is read (by field selector) and keeps every node it fits
        assert "pending_gpu_pods:1" in idle.reasons
        assert busy is not None and "activity_above_threshold:85%" in busy.reasons
        # the series naming two nodes are refused, as the whole cluster's join refuses them
        assert ambiguous is not None and any(r.startswith("series_unmapped") for r in ambiguous.reasons)
        # the zonal volume is reachable from another node of its zone: not node-local
        assert zonal is not None and not [r for r in zonal.reasons if r.startswith("local_storage")]
        assert silent is not None and silent.verdict == "unknown", silent
        # the exporter that stopped 130 s ago is stale by its own target's scrape interval (90 s bound)
        assert stopped is not None and stopped.verdict == "unknown", stopped
        assert [r for r in stopped.reasons if r.startswith("stale_metrics:")], stopped.reasons
        # AND so is the one whose target is named by the node's name: its up is read by that name too
        assert named is not None and named.verdict == "unknown", named
        assert [r for r in named.reasons if r.startswith("stale_metrics:")], named.reasons
        assert other is not None and other.verdict == "unknown", other
        assert [r for r in other.reasons if r.startswith("stale_metrics:")], other.reasons
    finally:
        double.stop()


def test_the_requests_of_one_node_do_not_grow_with_the_cluster(prometheus: str) -> None:
    counts = {}
    for size in (20, 120):
        double, config, observers = world(size, prometheus)
        try:
            double.clear_requests()
            builders.build_assessor(config, Policy(dry_run=False), observers).assess_node(
                name(3), AT + timedelta(seconds=30)
            )
            counts[size] = len(double.requests)
        finally:
            double.stop()
    assert counts[20] == counts[120], counts


def test_a_volume_reachable_from_this_node_only_keeps_it() -> None:
    """The witness search finds no other node when the only other node of the zone is cordoned."""
    from rightsizer.domain.model import Pod
    from rightsizer.domain.volumes import claim_local_data
    from rightsizer.services.node_view import node_local_volume_facts

    with KubernetesDouble(seed=3, resource_api_versions=None) as double:
        double.bind_cluster_role(cluster_role("rightsizer"))
        zone = {"topology.kubernetes.io/zone": "us-east-1c"}
        double.add_node(gpu_node("gpu-a", ip="10.0.0.1", labels=zone))
        double.add_node(gpu_node("gpu-b", ip="10.0.0.2", labels=zone, unschedulable=True))
        double.add_node(
            gpu_node("gpu-c", ip="10.0.0.3", labels={"topology.kubernetes.io/zone": "us-east-1d"})
        )
        double.add_pvc(pvc("data", "pv-z"))
        double.add_pv(pv("pv-z", affinity={"topology.kubernetes.io/zone": ["us-east-1c"]}))
        double.add_pod(pod("db-0", "gpu-a", volumes=[claim_volume("data")]))
        cluster = KubernetesCluster.for_eks(
            double.base_url,
            EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
        )
        pods = [Pod.model_validate(p) for p in cluster.list_pods_on_node("gpu-a")]
        facts = node_local_volume_facts(cluster, pods)
        assert claim_local_data("default", "data", "gpu-a", facts) == (
            "PersistentVolume pv-z is reachable from this node only (spec.nodeAffinity)"
        )
        # once another schedulable node joins the zone it is the witness, found by a selected list
        double.add_node(gpu_node("gpu-d", ip="10.0.0.4", labels=zone))
        double.clear_requests()
        facts = node_local_volume_facts(cluster, pods)
        assert claim_local_data("default", "data", "gpu-a", facts) is None
        lists = [r for r in double.requests if r.path == "/api/v1/nodes"]
        assert lists and all(r.param("fieldSelector") for r in lists)
        assert all(r.param("labelSelector") == "topology.kubernetes.io/zone in (us-east-1c)" for r in lists)


def test_the_whole_cluster_read_asks_prometheus_while_it_lists_the_pods(prometheus: str) -> None:
    """``observe_live`` starts its queries once the Nodes are listed (issue 33 item 2): the Pods are listed
    while Prometheus already works, and the signals are those of a read made after the Kubernetes one."""
    double, config, observers = world(40, prometheus)
    transport = RecordingTransport()
    observers = builders.live_observers(
        observers.cluster, None, PrometheusClient(prometheus, transport=transport)
    )
    asked: list[int] = []

    def pods_listed(request: RecordedRequest) -> None:  # before the Pods list is served
        if request.path == "/api/v1/pods" and not request.param("fieldSelector"):
            deadline = time.monotonic() + 10  # a read that waited for the Pods would never ask
            while not transport.queries and time.monotonic() < deadline:
                time.sleep(0.01)
            asked.append(len(transport.queries))

    double.on_request(pods_listed)
    double.bind_cluster_role(cluster_role("rightsizer-read"))  # the assessment's identity
    try:
        policy = Policy()
        snapshot = live.observe_live(config, policy, observers, AT + timedelta(seconds=30))
        after = live.live_signals(
            config, policy, dataclasses.replace(snapshot, signals=None), observers.collect
        )
    finally:
        double.stop()
    assert asked and asked[0] >= 1
    assert snapshot.signals == after.signals
    assert snapshot.signals is not None and len(snapshot.signals.devices) >= 5


class SlowTransport(RecordingTransport):
    """Each PromQL query answered ``delay`` seconds late: a query is in flight when the Kubernetes read fails."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        time.sleep(self.delay)
        return super().handle_request(request)


@pytest.mark.parametrize("where", ["pods", "joiner"])
def test_a_failed_kubernetes_read_ends_the_prometheus_read_before_it_raises(
    prometheus: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Prometheus read started once the Nodes were listed; when the rest of the read fails (the Pods
    list refused; or handing the joiner over failed) the caller gets that error, and by then the queries
    stopped, the Prometheus thread and its pool are joined and the cyclic collector is enabled: nothing
    outlives the call (a warm Lambda would carry them into its next invocation)."""
    double, config, observers = world(40, prometheus)
    transport = SlowTransport(0.2)
    observers = builders.live_observers(
        observers.cluster, None, PrometheusClient(prometheus, transport=transport)
    )

    def pods_listed(request: RecordedRequest) -> None:  # the queries are under way when the Pods are asked
        if request.path == "/api/v1/pods" and not request.param("fieldSelector"):
            deadline = time.monotonic() + 10
            while not transport.queries and time.monotonic() < deadline:
                time.sleep(0.01)

    double.on_request(pods_listed)
    double.bind_cluster_role(cluster_role("rightsizer-read"))
    if where == "pods":
        double.inject("GET", r"^/api/v1/pods$", 403, times=None)
        expected: type[BaseException] = Exception
    else:

        def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("joiner not built")

        monkeypatch.setattr("rightsizer.domain.join.NodeJoiner", broken)
        expected = RuntimeError
    before = set(threading.enumerate())
    try:
        with pytest.raises(expected) as raised:
            live.observe_live(config, Policy(), observers, AT + timedelta(seconds=30))
        # the double's own request threads (a kept-alive Kubernetes connection) are not the read's
        left = [t.name for t in set(threading.enumerate()) - before if "request" not in t.name]
    finally:
        double.stop()
    if where == "pods":
        assert "403" in str(raised.value) or "forbidden" in str(raised.value).lower(), raised.value
    assert transport.queries  # the read had started: the test is not vacuous
    assert left == []
    assert gc.isenabled()


def test_a_prometheus_thread_that_cannot_start_fails_with_its_own_error(
    prometheus: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Lambda at its thread limit cannot start the Prometheus read: the caller gets that error (not a
    join of a thread that never started, hiding it), and nothing is left paused or running."""

    class Unstartable(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    double, config, observers = world(4, prometheus)
    double.bind_cluster_role(cluster_role("rightsizer-read"))
    monkeypatch.setattr(live, "threading", SimpleNamespace(Thread=Unstartable))
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            live.observe_live(config, Policy(), observers, AT + timedelta(seconds=30))
    finally:
        double.stop()
    assert gc.isenabled()
