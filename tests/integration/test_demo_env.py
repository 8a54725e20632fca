"""The embedded default (docs/architecture.md §7): moto, the Kubernetes double and snapshot-form DCGM series together.

Everything goes through the product's real adapters over HTTP on 127.0.0.1: the Kubernetes adapter from
the environment's kubeconfig, the AWS inventory and Auto Scaling scaler on moto, and the snapshot-form
metrics reader. No client is mocked.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import ENERGY, GPU_UTIL
from rightsizer.services.observe import observe_request, snapshot_from_observation
from rightsizer.services.snapshot import metric_queries, observe
from rightsizer.testing.demo_env import (
    DemoEnvironment,
    demo_snapshot_dir,
    is_loopback_url,
    shift_timestamps,
)
from rightsizer.testing.snapshot_metrics import SnapshotMetrics
from rightsizer.wiring.builders import build_cluster_reader, build_inventory, decode_live_documents

pytestmark = pytest.mark.integration

EXPECTED: dict[str, dict[str, Any]] = json.loads((demo_snapshot_dir() / "expected.json").read_text())
STEP = 60


@pytest.fixture
def env() -> Iterator[DemoEnvironment]:
    with DemoEnvironment() as started:
        yield started
        # A background failure would otherwise only show as a confusing assertion elsewhere.
        assert started.syncer is not None
        assert started.reconciler is not None
        assert started.syncer.errors == []
        assert started.reconciler.errors == []
        assert started.double.internal_errors == []


def _refused(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((str(parts.hostname), int(parts.port or 80)), timeout=1):
            return False
    except OSError:
        return True


def _node_of(verdict: str, prefix: str = "") -> str:
    return next(n for n, e in sorted(EXPECTED.items()) if e["verdict"] == verdict and n.startswith(prefix))


def _group_nodes(env: DemoEnvironment, group: str) -> list[dict[str, Any]]:
    return [
        n
        for n in env.double.list_nodes()
        if n["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") == group
    ]


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _now_range() -> tuple[float, float]:
    end = float(int(time.time()))
    return end - 1800 + STEP, end


# ------------------------------------------------------------------------------------------- lifecycle


def test_starts_on_loopback_and_stops_cleanly() -> None:
    # GIVEN no AWS credentials in the environment (the demo must bring its own dummies)
    saved = {k: os.environ.pop(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if k in os.environ}
    try:
        started = time.perf_counter()
        demo = DemoEnvironment().start()
        start_s = time.perf_counter() - started
        try:
            # THEN every endpoint is on 127.0.0.1 and answers
            assert is_loopback_url(demo.endpoint_url)
            assert demo.kube_url.startswith("http://127.0.0.1:")
            assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
            assert demo.kubeconfig.is_file()
            assert (
                demo.clients.eks.describe_cluster(name=demo.cluster_name)["cluster"]["name"] == "demo-cluster"
            )
            table = demo.dynamodb.describe_table(TableName=demo.table_name)["Table"]
            assert table["TableStatus"] == "ACTIVE"
            assert len(demo.double.list_nodes()) == 15
            endpoints = (demo.endpoint_url, demo.kube_url)
            kubeconfig = demo.kubeconfig
            config = demo.config()
            assert config.aws.endpoint_url == demo.endpoint_url
            assert config.cluster.name == "demo-cluster"
            assert config.cluster.context == "rightsizer-demo"
            demo.require_own_endpoint(demo.endpoint_url)
            with pytest.raises(ValueError, match="only talks to its own moto server"):
                demo.require_own_endpoint("https://ec2.us-east-1.amazonaws.com")
        finally:
            stopping = time.perf_counter()
            demo.stop()
            stop_s = time.perf_counter() - stopping
        # AND stopping closes both servers, deletes the kubeconfig and takes back the dummy credentials
        assert all(_refused(url) for url in endpoints)
        assert not kubeconfig.exists()
        assert "AWS_ACCESS_KEY_ID" not in os.environ
        print(f"start {start_s:.2f} s ({demo.timings}), stop {stop_s:.2f} s")
    finally:
        os.environ.update(saved)


def test_every_node_stands_for_a_moto_instance_of_its_group(env: DemoEnvironment) -> None:
    groups = json.loads((demo_snapshot_dir() / "nodegroups.json").read_text())["nodegroups"]
    for ng in groups:
        name = ng["nodegroupName"]
        asg = env.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[env.asg_name(name)])
        group = asg["AutoScalingGroups"][0]
        sizes = ng["scalingConfig"]
        assert (group["MinSize"], group["DesiredCapacity"], group["MaxSize"]) == (
            sizes["minSize"],
            sizes["desiredSize"],
            sizes["maxSize"],
        )
        members = {i["InstanceId"] for i in group["Instances"]}
        nodes = _group_nodes(env, name)
        assert {n["spec"]["providerID"].rpartition("/")[2] for n in nodes} == members
    standalone = env.instance_of[_node_of("underutilized", "ip-10-3-")]
    reservation = env.clients.ec2.describe_instances(InstanceIds=[standalone])["Reservations"][0]
    tags = {t["Key"]: t["Value"] for t in reservation["Instances"][0]["Tags"]}
    assert tags["rightsizer.io/resize"] == "allowed"
    # The DaemonSets the pods name exist too (the drain skips DaemonSet pods by their owner).
    answer = httpx.get(
        f"{env.kube_url}/apis/apps/v1/daemonsets", headers={"Authorization": f"Bearer {env.token}"}, timeout=5
    )
    assert answer.status_code == 200
    names = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in answer.json()["items"]}
    assert ("gpu-operator", "nvidia-dcgm-exporter") in names
    unauthenticated = httpx.get(f"{env.kube_url}/api/v1/nodes", timeout=5)
    assert unauthenticated.status_code == 401


# ------------------------------------------------------------------------------------------ observe


def test_observe_through_the_real_adapters_decides_as_expected_json(env: DemoEnvironment) -> None:
    # GIVEN the readers the wiring builds from the environment's config, and the snapshot-form metrics
    config = env.config()
    policy = Policy()
    request = observe_request(config, policy, datetime.now(UTC))

    # WHEN the cluster is observed and planned with the default policy
    started = time.perf_counter()
    observation = observe(build_cluster_reader(config), build_inventory(config), env.metrics, request)
    observed = time.perf_counter()
    result = plan(snapshot_from_observation(observation, decode_live_documents), policy)
    planned = time.perf_counter()
    print(f"observe {observed - started:.2f} s, plan {planned - observed:.2f} s")

    # THEN every GPU node gets the verdict and reasons the demo snapshot documents
    assert {n.node for n in result.nodes} == set(EXPECTED)
    for node, want in EXPECTED.items():
        report = result.node(node)
        assert report.verdict == want["verdict"], (node, report.reasons)
        codes = [r.split(":", 1)[0] for r in report.reasons]
        assert set(want["reasons_include"]) <= set(codes), (node, report.reasons)
    # AND the idle a10g node is the one to scale in, known to moto as a member of its group
    scale_in = [a for a in result.actions if a.kind == "scale_in"]
    assert [(a.node, a.node_group, a.instance_id) for a in scale_in] == [
        (_node_of("idle"), "gpu-a10g", env.instance_of[_node_of("idle")])
    ]


def test_metrics_are_moved_to_the_present_on_the_snapshot_grid(env: DemoEnvironment) -> None:
    metrics = env.metrics
    start, end = _now_range()
    answer = metrics.query_range_raw(GPU_UTIL, start, end, STEP)
    assert answer["status"] == "success"
    assert answer["data"]["resultType"] == "matrix"
    assert metrics.shift_seconds % STEP == 0
    assert metrics.taken_at.timestamp() <= time.time()  # no sample in the future
    for series in answer["data"]["result"]:
        assert series["metric"]["__name__"] == GPU_UTIL
        assert series["values"][-1][0] == end
    stamped = metrics.query_range_raw(f"timestamp({GPU_UTIL})", start, end, STEP)["data"]["result"]
    assert stamped
    for series in stamped:
        assert "__name__" not in series["metric"]
        for at, raw in series["values"]:
            assert 0 < at - float(raw) < STEP + 15  # the newest raw scrape behind each step
    # Every query observe() issues is answered, with and without a job filter (non-finite answers hold
    # only the series with a NaN/±Inf sample: none in the demo snapshot).
    for job in (None, "nvidia-dcgm-exporter"):
        for path, expr in metric_queries(job, step_seconds=STEP, window_seconds=end - start + STEP).items():
            answer = metrics.query_range_raw(expr, start, end, STEP)
            assert answer["status"] == "success", expr
            assert bool(answer["data"]["result"]) != path.endswith(".nonfinite.json"), expr
    # On the snapshot's step grid, a per-step maximum sees the one raw scrape of each step: the
    # snapshot's own values.
    end = metrics.taken_at.timestamp()
    start = end - 1800 + STEP
    stepped = metrics.query_range_raw(f"max_over_time({GPU_UTIL}[{STEP * 1000 - 1}ms])", start, end, STEP)
    plain = {
        tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): s["values"]
        for s in answer_of(metrics, GPU_UTIL, start, end)
    }
    for series in stepped["data"]["result"]:
        assert series["values"] == plain[tuple(sorted(series["metric"].items()))]
    assert metrics.query_range_raw(f'{GPU_UTIL}{{job="other"}}', start, end, STEP)["data"]["result"] == []
    refused = metrics.query_range_raw(f"rate({ENERGY}[5m])", start, end, STEP)
    assert refused["status"] == "error"
    assert refused["errorType"] == "bad_data"


def answer_of(metrics: SnapshotMetrics, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = metrics.query_range_raw(expr, start, end, STEP)["data"]["result"]
    return result


def test_shift_lands_the_snapshot_end_in_the_last_whole_step_before_now() -> None:
    # GIVEN "now" at several offsets from the snapshot's own end (no wall clock: a loaded machine
    # must not turn this into a timing test)
    base = SnapshotMetrics(demo_snapshot_dir(), now=0.0)
    original_end = base.taken_at.timestamp() - base.shift_seconds
    for offset in (0.0, 1.0, STEP - 0.001, STEP, 7 * STEP + 13.5, 86_400 * 3 + 59.9):
        now = original_end + offset
        metrics = SnapshotMetrics(demo_snapshot_dir(), now=now)
        # THEN the shift is whole steps and the newest sample is within one step before "now"
        assert metrics.shift_seconds % STEP == 0
        assert 0 <= now - metrics.taken_at.timestamp() < STEP


def test_series_continue_past_the_snapshot_with_growing_energy() -> None:
    # GIVEN the snapshot moved to a "now" that is 90 minutes of steps past its own end
    metrics = SnapshotMetrics(demo_snapshot_dir(), now=time.time())
    later = metrics.taken_at.timestamp() + 90 * 60
    energy = metrics.query_range_raw(ENERGY, later - 1800 + STEP, later, STEP)["data"]["result"]
    frozen = _node_of("unknown", "ip-10-1-")
    assert energy
    for series in energy:
        values = [int(v) for _, v in series["values"]]
        assert len(values) == 30
        if series["metric"]["node"] == frozen:
            assert len(set(values)) == 1  # a frozen exporter stays frozen
        else:
            assert all(b > a for a, b in itertools.pairwise(values))


def test_shift_timestamps_moves_rfc3339_strings_only() -> None:
    moved = shift_timestamps({"a": ["2026-11-02T10:00:00Z", "2026-11-02T10:00:00.5Z"], "b": "x", "c": 3}, 60)
    assert moved == {"a": ["2026-11-02T10:01:00Z", "2026-11-02T10:01:00.5Z"], "b": "x", "c": 3}


# -------------------------------------------------------------------------------- node lifecycle


def test_terminated_instance_takes_its_node_away_within_a_second(env: DemoEnvironment) -> None:
    # GIVEN the idle a10g node and its instance
    node = _node_of("idle")
    instance = env.instance_of[node]
    assert env.double.list_pods(node)

    # WHEN the Act adapter removes exactly that instance from its group
    result = AutoScalingGroups(env.clients.autoscaling).terminate(env.asg_name("gpu-a10g"), instance)
    terminated = time.monotonic()

    # THEN the Node and the pods bound to it are gone within a second, and so are its series
    assert (result.desired_before, result.desired_after) == (5, 4)
    assert env.wait_for(lambda: env.double.get_node(node) is None, timeout_s=1.0)
    print(f"node removed {time.monotonic() - terminated:.2f} s after the terminate")
    assert env.double.list_pods(node) == []
    assert node not in env.metrics.nodes()
    end = _now_range()[1] + STEP  # a step after the removal: stale markers end the series
    series = env.metrics.query_range_raw(GPU_UTIL, end, end, STEP)["data"]["result"]
    assert node not in {s["metric"]["node"] for s in series}
    # AND the reconciler mirrors the ASG's new desired size onto the node group, as EKS does
    assert env.wait_for(
        lambda: (
            env.clients.eks.describe_nodegroup(clusterName=env.cluster_name, nodegroupName="gpu-a10g")[
                "nodegroup"
            ]["scalingConfig"]["desiredSize"]
            == 4
        )
    )


def test_raising_desired_brings_a_new_ready_node_with_gpus_and_series(env: DemoEnvironment) -> None:
    before = {n["metadata"]["name"] for n in _group_nodes(env, "gpu-a10g")}
    template_uuids = {
        s["UUID"] for name in before for s in env.metrics.series_of(name) if s.get("UUID") is not None
    }

    # WHEN the node group's desired size goes from 5 to 6 (UpdateNodegroupConfig; the reconciler resizes
    # the ASG, moto launches an instance)
    env.clients.eks.update_nodegroup_config(
        clusterName=env.cluster_name,
        nodegroupName="gpu-a10g",
        scalingConfig={"minSize": 1, "desiredSize": 6, "maxSize": 8},
    )
    assert env.wait_for(lambda: len(_group_nodes(env, "gpu-a10g")) == 6)

    # THEN a new Ready node stands for the new instance, with all its GPUs allocatable
    (new,) = [n for n in _group_nodes(env, "gpu-a10g") if n["metadata"]["name"] not in before]
    name = new["metadata"]["name"]
    assert _ready(new)
    assert (
        new["status"]["allocatable"]["nvidia.com/gpu"] == new["status"]["capacity"]["nvidia.com/gpu"] == "4"
    )
    assert not new["spec"].get("unschedulable")
    instance = new["spec"]["providerID"].rpartition("/")[2]
    group = env.clients.autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[env.asg_name("gpu-a10g")]
    )
    assert instance in {i["InstanceId"] for i in group["AutoScalingGroups"][0]["Instances"]}
    ip = next(a["address"] for a in new["status"]["addresses"] if a["type"] == "InternalIP")
    assert name == f"ip-{ip.replace('.', '-')}.ec2.internal"
    # AND its DaemonSet pods run on it, the dcgm-exporter among them
    pods = env.double.list_pods(name)
    exporter = next(p for p in pods if p["metadata"]["name"].startswith("nvidia-dcgm-exporter-"))
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in pods} == {"DaemonSet"}
    # AND it has its own DCGM series from its creation on: its GPUs, scraped from its exporter pod
    assert env.wait_for(lambda: len(env.metrics.series_of(name)) == 4)
    series = env.metrics.series_of(name)
    assert len(series) == 4
    assert {s["instance"] for s in series} == {f"{exporter['status']['podIP']}:9400"}
    assert len({s["UUID"] for s in series}) == 4
    assert not {s["UUID"] for s in series} & template_uuids
    end = float(int(time.time())) + STEP
    answer = env.metrics.query_range_raw(GPU_UTIL, end, end, STEP)["data"]["result"]
    assert sum(1 for s in answer if s["metric"]["node"] == name) == 4
    up = env.metrics.query_range_raw("up", end, end, STEP)["data"]["result"]
    assert [s["values"][0][1] for s in up if s["metric"]["node"] == name] == ["1"]


def test_off_hours_cycle_restores_the_dev_group_exactly(env: DemoEnvironment) -> None:
    # GIVEN the dev node group with its two idle nodes
    original = {n["metadata"]["name"] for n in _group_nodes(env, "gpu-dev")}
    assert len(original) == 2

    def resize(desired: int) -> None:
        env.clients.eks.update_nodegroup_config(
            clusterName=env.cluster_name,
            nodegroupName="gpu-dev",
            scalingConfig={"minSize": 0, "desiredSize": desired, "maxSize": 2},
        )

    # WHEN off-hours scales it to zero, THEN both nodes and their series go away
    resize(0)
    assert env.wait_for(lambda: not _group_nodes(env, "gpu-dev"))
    assert not original & env.metrics.nodes()
    # WHEN the schedule ends and desired is restored, THEN two new Ready nodes join, with series
    resize(2)
    assert env.wait_for(lambda: len(_group_nodes(env, "gpu-dev")) == 2)
    restored = _group_nodes(env, "gpu-dev")
    assert all(_ready(n) for n in restored)
    names = {n["metadata"]["name"] for n in restored}
    assert not names & original
    # A new node's exporter is scraped a moment after the Node appears, as in a real cluster.
    assert env.wait_for(lambda: names <= env.metrics.nodes())
    group = env.clients.autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[env.asg_name("gpu-dev")]
    )
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 2
