"""Field failure cases about metrics, joins, classification and verdicts (tests/fixtures/cases/BUG-*).

Each case's input becomes a fixture and its expected behaviour an assertion; neighbours of the same fault
class are tested beside it.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import (
    AT,
    asg,
    const,
    device_series,
    exporter_pod,
    gpu_node,
    jitter,
    merge_metrics,
    node_devices,
    pod,
    rfc,
    snapshot,
    verdict_reasons,
)

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"


def load_case(name: str) -> Any:
    path = CASES / name
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def codes(reasons: list[str]) -> list[str]:
    return [r.split(":", 1)[0] for r in verdict_reasons(reasons)]


# --- BUG-01: Hostname is the exporter pod name or 'localhost' -------------------------------------------


def bug01_snapshot(hostnames: dict[str, str] | None = None) -> Any:
    case = load_case("BUG-01.json")
    ctx = case["kubernetes_context"]
    nodes = [gpu_node(n["name"], instance_type="g5.xlarge", gpus=1, ip=n["internalIP"]) for n in ctx["nodes"]]
    pods = [exporter_pod(p["nodeName"], p["podIP"], p["name"]) for p in ctx["exporter_pods"]]
    pods.append(pod("llm-serve-6d9f-abcde", "gpu-node-b", namespace="inference", gpus=1))
    parts = []
    for item in case["prometheus_response"]["data"]["result"]:
        labels = {k: v for k, v in item["metric"].items() if v}
        if hostnames:
            labels["Hostname"] = hostnames.get(labels["Hostname"], labels["Hostname"])
        busy = float(item["value"][1]) > 50
        parts.append(
            device_series(
                labels,
                util=jitter(float(item["value"][1]), 1) if busy else const(0),
                fb_used=const(20000) if busy else jitter(250, 1),
                power=jitter(180, 5) if busy else jitter(26, 1),
            )
        )
    return snapshot(nodes, pods, merge_metrics(*parts))


def test_bug01_series_join_by_instance_ip_not_hostname() -> None:
    result = plan(bug01_snapshot(), Policy(max_nodes_per_run=5, max_nodes_per_node_group=5))
    verdicts = {n.node: n.verdict for n in result.nodes}
    assert verdicts == {"gpu-node-a": "idle", "gpu-node-b": "busy", "gpu-node-c": "idle"}
    assert result.node("gpu-node-b").gpu_activity_max_pct == pytest.approx(87.4, abs=1.01)
    assert result.unmapped == []
    assert {a.node for a in result.actions if a.kind == "scale_in"} == {"gpu-node-a", "gpu-node-c"}


def test_bug01_hostname_naming_another_node_makes_series_unmapped_and_node_unknown() -> None:
    # Same class: Hostname equal to a *different* Node's name contradicts the instance IP join.
    result = plan(bug01_snapshot({"localhost": "gpu-node-a"}), Policy())
    assert result.node("gpu-node-c").verdict == "unknown"
    assert "no_series" in codes(result.node("gpu-node-c").reasons)
    assert result.node("gpu-node-a").verdict == "unknown"
    assert "series_unmapped" in codes(result.node("gpu-node-a").reasons)
    assert {u.reason for u in result.unmapped} == {"series_unmapped:ambiguous:gpu-node-a,gpu-node-c"}


def test_bug01_unresolvable_series_never_idle() -> None:
    nodes = [gpu_node("gpu-x", instance_type="g5.xlarge", gpus=1, ip="198.51.100.9")]
    metrics = device_series(
        {"Hostname": "localhost", "instance": "192.0.2.99:9400", "gpu": "0", "UUID": "GPU-x"}
    )
    result = plan(snapshot(nodes, [], metrics), Policy())
    assert result.node("gpu-x").verdict == "unknown"
    assert len(result.unmapped) == len(metrics)
    assert all(u.reason == "series_unmapped:no_match" for u in result.unmapped)
    assert result.actions == []


# --- BUG-02: MIG ---------------------------------------------------------------------------------------


def mig_node(name: str = "gpu-node-mig-1") -> dict[str, Any]:
    case = load_case("BUG-02.json")["node"]
    return gpu_node(
        name,
        instance_type="p4d.24xlarge",
        gpus=0,
        labels={**case["labels"], "nvidia.com/gpu.count": "8"},
        capacity={"nvidia.com/gpu": "0", "nvidia.com/mig-3g.20gb": "2"},
        nodegroup="p4d-mig",
    )


def mig_metrics(prof: dict[str, float] | None) -> dict[str, Any]:
    parts = []
    for gi in ("1", "2"):
        labels = {
            "node": "gpu-node-mig-1",
            "gpu": "0",
            "UUID": "GPU-mig0",
            "GPU_I_ID": gi,
            "GPU_I_PROFILE": "3g.20gb",
        }
        parts.append(
            device_series(
                labels,
                util=const(0),
                prof=None if prof is None else jitter(prof[gi], 0.01) if prof[gi] else const(0),
                fb_used=None,
                power=None,
                energy=None,
            )
        )
    parent = {"node": "gpu-node-mig-1", "gpu": "0", "UUID": "GPU-mig0"}
    parts.append(
        device_series(parent, util=None, fb_used=jitter(800, 5), fb_total=40960, power=jitter(90, 2))
    )
    return merge_metrics(*parts)


def test_bug02_mig_uses_prof_metric_per_instance_and_is_busy() -> None:
    # The case's PROF value 0.71 is a ratio: 71 %, not 0.71 % — and DEV_GPU_UTIL stuck at 0 is ignored.
    result = plan(snapshot([mig_node()], [], mig_metrics({"1": 0.71, "2": 0.0})), Policy())
    report = result.node("gpu-node-mig-1")
    assert report.verdict in ("busy", "underutilized")
    assert report.gpu_activity_max_pct == pytest.approx(72.0, abs=0.01)
    assert codes(report.reasons)[0] == "activity_above_threshold"


def test_bug02_mig_without_prof_metric_is_unknown_not_idle() -> None:
    result = plan(snapshot([mig_node()], [], mig_metrics(None)), Policy())
    report = result.node("gpu-node-mig-1")
    assert report.verdict == "unknown"
    assert "no_series" in codes(report.reasons)
    assert result.actions == []


def test_mig_single_strategy_counts_instances_from_gpu_capacity() -> None:
    node = gpu_node(
        "mig-single",
        instance_type="p4d.24xlarge",
        gpus=14,
        labels={
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        },
    )
    # Only 1 instance reports: 13 of 14 expected MIG devices lack series.
    labels = {"node": "mig-single", "gpu": "0", "UUID": "GPU-s0", "GPU_I_ID": "1"}
    metrics = device_series(labels, util=None, prof=const(0))
    report = plan(snapshot([node], [], metrics), Policy()).node("mig-single")
    assert report.verdict == "unknown"
    assert "no_series:13_of_14_devices" in report.reasons


# --- BUG-03: PROF reads 0 while the GPU is saturated ---------------------------------------------------


def test_bug03_any_saturated_signal_makes_busy_and_flags_disagreement() -> None:
    case = load_case("BUG-03.json")["signals_per_gpu"]
    node = gpu_node("gpu-node-h100-1", instance_type="p5.48xlarge", gpus=8, nodegroup="p5")
    exporter = exporter_pod("gpu-node-h100-1", "10.9.9.9", "nvidia-dcgm-exporter-h100x")
    parts = []
    for g in range(8):
        key = f"gpu{g}"
        parts.append(
            device_series(
                {"node": "gpu-node-h100-1", "gpu": str(g), "UUID": f"GPU-h{g}"},
                util=const(float(case["DCGM_FI_DEV_GPU_UTIL"][key])),
                prof=const(float(case["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][key])),
                fb_used=const(float(case["DCGM_FI_DEV_FB_USED_MiB"][key])),
                fb_total=81559,
                power=jitter(float(case["DCGM_FI_DEV_POWER_USAGE_W"][key]), 3),
            )
        )
    trainer = pod("pretrain-worker-3", "gpu-node-h100-1", namespace="ml", gpus=8)
    report = plan(snapshot([node], [exporter, trainer], merge_metrics(*parts)), Policy()).node(
        "gpu-node-h100-1"
    )
    # busy at 100% activity: every cheaper 8-GPU type (A100, L40S, A10G...) has less compute and memory
    # bandwidth than the H100, so no cheaper shape serves it (issue 17) and the verdict is the case's "busy".
    assert report.verdict == "busy"
    assert report.reasons[:4] == [
        "activity_above_threshold:100%",
        "fb_above_threshold:71240MiB",
        f"power_above_idle:{655.0 + 3 * max(math.sin(i * 1.7) for i in range(31)):g}W>150W",
        "signals_disagree:gpu-operator/nvidia-dcgm-exporter-h100x",
    ]


def test_signals_disagree_alone_does_not_change_an_idle_verdict_class() -> None:
    # PROF 0.6 (60 %) vs UTIL 2 %: > 50 points apart ⇒ flagged; activity is the max ⇒ busy anyway.
    node = gpu_node("g", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("g", 1, util=const(2), prof=const(0.6))
    report = plan(snapshot([node], [], metrics), Policy()).node("g")
    assert "signals_disagree:g" in report.reasons
    assert report.verdict in ("busy", "underutilized")


# --- BUG-04: frozen exporter ---------------------------------------------------------------------------


def test_bug04_frozen_energy_counter_is_unknown_even_with_up_1() -> None:
    case = load_case("BUG-04.json")["query_range"]["responses"]
    power = float(case["DCGM_FI_DEV_POWER_USAGE"]["data"]["result"][0]["values"][0][1])
    node = gpu_node("gpu-node-d", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("gpu-node-d", 1, util=const(0), power=const(power), energy="frozen")
    metrics["up"] = [
        device_series({"node": "gpu-node-d", "instance": "192.0.2.31:9400"}, util=const(1))[
            "DCGM_FI_DEV_GPU_UTIL"
        ][0]
    ]
    result = plan(snapshot([node], [], metrics), Policy())
    report = result.node("gpu-node-d")
    assert report.verdict == "unknown"
    assert codes(report.reasons) == ["exporter_frozen"]
    assert result.actions == []


def test_frozen_power_without_energy_counter_is_unknown() -> None:
    node = gpu_node("f", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("f", 1, power=const(61.287), energy=None)
    assert plan(snapshot([node], [], metrics), Policy()).node("f").verdict == "unknown"


def test_no_energy_and_no_power_is_no_liveness_signal() -> None:
    node = gpu_node("n", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("n", 1, power=None, energy=None)
    report = plan(snapshot([node], [], metrics), Policy()).node("n")
    assert report.verdict == "unknown"
    assert "no_liveness_signal" in report.reasons


def test_stale_samples_are_unknown() -> None:
    # The newest raw sample (timestamp()) is 10 minutes old: Prometheus' lookback stretched the matrix.
    node = gpu_node("s", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("s", 1)
    labels = {"node": "s", "gpu": "0", "UUID": "GPU-s-0"}
    stamp = (AT - timedelta(minutes=10)).timestamp()
    ts = device_series(labels, util=const(stamp))["DCGM_FI_DEV_GPU_UTIL"]
    report = plan(snapshot([node], [], metrics, timestamps={"DCGM_FI_DEV_GPU_UTIL": ts}), Policy()).node("s")
    assert report.verdict == "unknown"
    assert verdict_reasons(report.reasons) == ["stale_metrics:600s"]


# --- BUG-05: missing series ----------------------------------------------------------------------------


def test_bug05_partial_and_absent_series_are_unknown() -> None:
    case = load_case("BUG-05.json")
    nodes = [
        gpu_node(n["name"], instance_type="p4d.24xlarge", gpus=8, nodegroup="p4d")
        for n in case["kubernetes_context"]["gpu_nodes"]
    ]
    present: dict[str, list[int]] = {}
    for item in case["prometheus_response"]["data"]["result"]:
        present.setdefault(item["metric"]["node"], []).append(int(item["metric"]["gpu"]))
    parts = [
        device_series(
            {"node": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}"}, fb_total=40960, power=jitter(55, 1)
        )
        for node, gpus in present.items()
        for g in gpus
    ]
    metrics = merge_metrics(*parts)
    up = []
    for item in case["up_response"]["data"]["result"]:
        value = float(item["value"][1])
        up.extend(device_series(item["metric"], util=const(value))["DCGM_FI_DEV_GPU_UTIL"])
    metrics["up"] = up
    result = plan(snapshot(nodes, [], metrics), Policy(max_nodes_per_run=3, max_nodes_per_node_group=3))
    a, b, c = (result.node(f"gpu-node-{x}") for x in "abc")
    assert a.verdict == "idle" and a.coverage == 1.0
    assert b.verdict == "unknown" and "no_series:6_of_8_devices" in b.reasons and b.coverage == 0.0
    assert c.verdict == "unknown" and "no_series:8_of_8_devices" in c.reasons
    assert [x.node for x in result.actions] == ["gpu-node-a"]


def test_up_zero_for_part_of_window_caps_coverage() -> None:
    node = gpu_node("u", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("u", 1)
    metrics["up"] = device_series({"node": "u"}, util=lambda i: 0.0 if i < 10 else 1.0)[
        "DCGM_FI_DEV_GPU_UTIL"
    ]
    report = plan(snapshot([node], [], metrics), Policy()).node("u")
    assert report.coverage == pytest.approx(21 / 30)
    assert report.verdict == "unknown"
    assert "coverage_below_min:0.70<0.9" in report.reasons


def test_gaps_in_series_lower_coverage() -> None:
    node = gpu_node("gap", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("gap", 1, util=lambda i: math.nan if 5 <= i < 10 else 0.0)
    report = plan(snapshot([node], [], metrics), Policy()).node("gap")
    assert report.verdict == "unknown"
    assert report.coverage == pytest.approx(25 / 30)
    assert "non_finite:DCGM_FI_DEV_GPU_UTIL" in report.reasons


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_values_are_unknown(value: float) -> None:
    node = gpu_node("nf", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("nf", 1, fb_used=lambda i: value if i == 30 else 100.0)
    report = plan(snapshot([node], [], metrics), Policy()).node("nf")
    assert report.verdict == "unknown"
    assert "non_finite:DCGM_FI_DEV_FB_USED" in report.reasons


@pytest.mark.parametrize("problem", ["warnings", "status_error", "not_a_matrix"])
def test_partial_response_makes_every_gpu_node_unknown(problem: str) -> None:
    node = gpu_node("p", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("p", 1)
    report = plan(
        snapshot([node], [], metrics, problems={"DCGM_FI_DEV_POWER_USAGE": problem}), Policy()
    ).node("p")
    assert report.verdict == "unknown"
    assert "partial_response:DCGM_FI_DEV_POWER_USAGE" in report.reasons


def test_missing_required_metric_file_is_partial_response() -> None:
    node = gpu_node("m", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("m", 1)
    del metrics["DCGM_FI_DEV_FB_USED"]
    report = plan(snapshot([node], [], metrics), Policy()).node("m")
    assert report.verdict == "unknown"
    assert "partial_response:DCGM_FI_DEV_FB_USED" in report.reasons


def test_window_longer_than_snapshot_counts_as_uncovered() -> None:
    node = gpu_node("w", instance_type="g5.xlarge", gpus=1)
    report = plan(snapshot([node], [], node_devices("w", 1)), Policy(idle_window="60m")).node("w")
    # 31 points of the 30-minute snapshot (both ends) lie inside the 60-minute window of 60 steps.
    assert report.coverage == pytest.approx(31 / 60)
    assert report.verdict == "unknown"


# --- BUG-06: empty pod labels; workload through NVIDIA_VISIBLE_DEVICES ----------------------------------


def test_bug06_unattributed_gpu_use_is_busy_by_framebuffer_and_holder_named() -> None:
    case = load_case("BUG-06.yaml")
    node = gpu_node("gpu-node-e", instance_type="g5.xlarge", gpus=1)
    fb = float(case["prometheus_series"][0]["value"])
    util = float(case["prometheus_series"][1]["value"])
    labels = {k: v for k, v in case["prometheus_series"][0]["labels"].items() if v}
    metrics = device_series(labels, util=const(util), fb_used=const(fb))
    pods = [p for p in case["kubernetes_pods_on_node"]]
    for p in pods:
        p["metadata"]["ownerReferences"][0].setdefault("apiVersion", "apps/v1")
    report = plan(snapshot([node], pods, metrics), Policy()).node("gpu-node-e")
    assert report.verdict in ("busy", "underutilized")
    assert "fb_above_threshold:15872MiB" in report.reasons
    assert "idle_gpu_holder:search/embed-api-5c7d9b-xk2lq" in report.reasons


@pytest.mark.parametrize(
    ("extra", "holder"),
    [
        ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, True),
        ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}, False),
        (
            {
                "env": [
                    {
                        "name": "NVIDIA_VISIBLE_DEVICES",
                        "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}},
                    }
                ]
            },
            True,
        ),
        ({"runtime": "nvidia"}, True),
        ({"privileged": True}, True),
        ({}, False),
    ],
)
def test_gpu_holder_detection_keeps_an_idle_node_protected(extra: dict[str, Any], holder: bool) -> None:
    node = gpu_node("h", instance_type="g5.xlarge", gpus=1)
    p = pod("server-1", "h", env=extra.get("env"))
    if extra.get("runtime"):
        p["spec"]["runtimeClassName"] = extra["runtime"]
    if extra.get("privileged"):
        p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    result = plan(snapshot([node], [p], node_devices("h", 1), room=True), Policy())
    assert result.node("h").verdict == ("protected" if holder else "idle")
    if holder:
        assert result.node("h").reasons[0] == "idle_gpu_holder:default/server-1"
        assert [a.kind for a in result.actions] == ["recommend"]
        assert "scale the owner to zero" in result.actions[0].reason
    opted = plan(snapshot([node], [p], node_devices("h", 1), room=True), Policy(evict_idle_gpu_holders=True))
    assert opted.node("h").verdict == "idle"


# --- BUG-18: drain classification ----------------------------------------------------------------------


def test_bug18_pod_classification() -> None:
    case = load_case("BUG-18.yaml")
    pods = []
    for p in case["pods"]:
        obj = pod(p["name"], case["node"], namespace=p["namespace"], owner=None, phase=p["status"]["phase"])
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", **o} for o in p.get("ownerReferences", [])]
        obj["metadata"]["annotations"] = p.get("annotations", {})
        obj["spec"]["volumes"] = p.get("spec", {}).get("volumes", [])
        pods.append(obj)
    node = gpu_node(case["node"], instance_type="g5.xlarge", gpus=1)
    report = plan(snapshot([node], pods, node_devices(case["node"], 1)), Policy()).node(case["node"])
    assert report.verdict == "protected"
    assert verdict_reasons(report.reasons) == [
        "bare_pod:default/debug-shell",
        "local_storage:research/notebook-7d8f-abcde",
    ]
    allowed = Policy(delete_emptydir_data=True, allow_bare_pods=True)
    report = plan(snapshot([node], pods, node_devices(case["node"], 1), room=True), allowed).node(
        case["node"]
    )
    assert report.verdict == "idle"


def test_system_pods_without_pdb_block_and_with_pdb_do_not() -> None:
    node = gpu_node("k", instance_type="g5.xlarge", gpus=1)
    coredns = pod("coredns-abc", "k", namespace="kube-system", labels={"k8s-app": "kube-dns"})
    snap = snapshot([node], [coredns], node_devices("k", 1))
    assert verdict_reasons(plan(snap, Policy()).node("k").reasons) == ["system_pod:kube-system/coredns-abc"]
    with_pdb = snapshot(
        [node],
        [coredns],
        node_devices("k", 1),
        pdbs=[pdb_obj("coredns", "kube-system", {"k8s-app": "kube-dns"}, 1)],
        room=True,
    )
    assert plan(with_pdb, Policy()).node("k").verdict == "idle"


def pdb_obj(name: str, ns: str, match: dict[str, str], allowed: int) -> dict[str, Any]:
    from tests.builders import pdb

    return pdb(name, ns, match, allowed)


def test_pdb_with_no_disruptions_and_multiple_pdbs_block() -> None:
    node = gpu_node("q", instance_type="g5.xlarge", gpus=1)
    web = pod("web-1", "q", namespace="prod", labels={"app": "web", "tier": "front"})
    one = snapshot([node], [web], node_devices("q", 1), pdbs=[pdb_obj("web", "prod", {"app": "web"}, 0)])
    assert verdict_reasons(plan(one, Policy()).node("q").reasons) == ["pdb_blocks:prod/web-1:web"]
    two = snapshot(
        [node], [web], node_devices("q", 1),
        pdbs=[pdb_obj("web", "prod", {"app": "web"}, 1), pdb_obj("front", "prod", {"tier": "front"}, 1)],
    )  # fmt: skip
    # Both PodDisruptionBudgets are named (issue 12), not only the pod.
    assert verdict_reasons(plan(two, Policy()).node("q").reasons) == ["multiple_pdbs:prod/web-1:front,web"]


def test_grace_period_longer_than_drain_timeout_blocks() -> None:
    node = gpu_node("gr", instance_type="g5.xlarge", gpus=1)
    slow = pod("ckpt-0", "gr", grace=900)
    assert verdict_reasons(
        plan(snapshot([node], [slow], node_devices("gr", 1)), Policy()).node("gr").reasons
    ) == ["grace_exceeds_drain_timeout:default/ckpt-0"]
    assert (
        plan(snapshot([node], [slow], node_devices("gr", 1), room=True), Policy(drain_timeout="20m"))
        .node("gr")
        .verdict
        == "idle"
    )


# --- BUG-20: new node, GPUs not allocatable yet ---------------------------------------------------------


def test_bug20_warming_node_is_unknown_and_pending_pod_protects() -> None:
    case = load_case("BUG-20.yaml")
    now = case["now"]
    node = case["node"]
    node["spec"] = {"providerID": "aws:///us-east-1a/i-0000000000000000f"}
    pending = pod("whisper-7c9d-zzzzz", None, namespace="inference", gpus=1, phase="Pending")
    from rightsizer.cli import parse_time

    at = parse_time(now)
    snap = snapshot([node], [pending], {}, at=at)
    report = plan(snap, Policy(), at).node("gpu-node-o")
    assert report.verdict == "unknown"
    assert codes(report.reasons)[:1] == ["no_series"]
    for code in ("gpus_not_allocatable", "node_too_young", "pending_gpu_pods"):
        assert code in codes(report.reasons)
    assert plan(snap, Policy(), at).actions == []


def test_pending_gpu_pod_that_cannot_tolerate_taint_does_not_protect() -> None:
    node = gpu_node(
        "t",
        instance_type="g5.xlarge",
        gpus=1,
        taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    )
    pending = pod("wants-gpu", None, gpus=1, phase="Pending")
    assert (
        "pending_gpu_pods:1"
        not in plan(snapshot([node], [pending], node_devices("t", 1)), Policy()).node("t").reasons
    )
    pending["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (
        "pending_gpu_pods:1"
        in plan(snapshot([node], [pending], node_devices("t", 1)), Policy()).node("t").reasons
    )


# --- BUG-22: running batch and do-not-disrupt -----------------------------------------------------------


def test_bug22_running_jobs_and_do_not_disrupt_protect() -> None:
    case = load_case("BUG-22.yaml")
    nodes, pods_, parts = [], [], []
    for n in case["nodes"]:
        nodes.append(gpu_node(n["name"], instance_type="g5.xlarge", gpus=1))
        for p in n["pods"]:
            obj = pod(
                p["metadata"]["name"],
                n["name"],
                namespace=p["metadata"]["namespace"],
                owner=("Job", "batch/v1"),
            )
            obj["metadata"]["annotations"] = p["metadata"].get("annotations") or {}
            pods_.append(obj)
        fb = n["gpu_mem_used_fraction"] * 23028
        parts.append(
            node_devices(n["name"], 1, util=const(n["gpu_util_30m_avg"]), fb_used=const(max(fb, 200)))
        )
    result = plan(snapshot(nodes, pods_, merge_metrics(*parts)), Policy())
    q, r = result.node("gpu-node-q"), result.node("gpu-node-r")
    assert q.verdict in ("busy", "underutilized")
    assert "running_batch_pod:ml/llama-ft-job-0-abcde" in q.reasons
    assert r.verdict == "protected"
    assert verdict_reasons(r.reasons) == [
        "running_batch_pod:ml/eval-sweep-7",
        "do_not_disrupt:ml/eval-sweep-7",
    ]
    assert [a for a in result.actions if a.kind == "scale_in"] == []


@pytest.mark.parametrize(
    ("owner", "blocked"),
    [
        (("PyTorchJob", "kubeflow.org/v1"), True),
        (("RayJob", "ray.io/v1"), True),
        (("JobSet", "jobset.x-k8s.io/v1alpha2"), True),
        (("Job", "batch.volcano.sh/v1alpha1"), True),
        (("ReplicaSet", "apps/v1"), False),
    ],
)
def test_batch_owner_groups(owner: tuple[str, str], blocked: bool) -> None:
    node = gpu_node("b", instance_type="g5.xlarge", gpus=1)
    p = pod("worker-0", "b", owner=owner)
    reasons = plan(snapshot([node], [p], node_devices("b", 1)), Policy()).node("b").reasons
    assert ("running_batch_pod:default/worker-0" in reasons) is blocked


def test_karpenter_do_not_disrupt_duration_expires() -> None:
    node = gpu_node("d", instance_type="g5.xlarge", gpus=1)
    p = pod("svc-0", "d", annotations={"karpenter.sh/do-not-disrupt": "6h"})  # started 5 h before AT
    assert (
        "do_not_disrupt:default/svc-0"
        in plan(snapshot([node], [p], node_devices("d", 1)), Policy()).node("d").reasons
    )
    p["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] = "4h"
    assert plan(snapshot([node], [p], node_devices("d", 1), room=True), Policy()).node("d").verdict == "idle"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"annotations": {"rightsizer.io/do-not-disrupt": "true"}}, "do_not_disrupt"),
        ({"annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}, "do_not_disrupt"),
        ({"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}, "other_autoscaler"),
        ({"labels": {"karpenter.sh/nodepool": "gpu"}}, "karpenter_owned"),
        ({"unschedulable": True}, "cordoned_by_other"),
    ],
)
def test_node_protections(change: dict[str, Any], code: str) -> None:
    node = gpu_node("np", instance_type="g5.xlarge", gpus=1, **change)
    report = plan(snapshot([node], [], node_devices("np", 1)), Policy()).node("np")
    assert report.verdict == "protected"
    assert code in codes(report.reasons)


# --- counts and allocatable ----------------------------------------------------------------------------


def test_catalog_and_label_gpu_count_mismatch_is_unknown() -> None:
    node = gpu_node("mm", instance_type="g5.12xlarge", gpus=4, labels={"nvidia.com/gpu.count": "2"})
    report = plan(snapshot([node], [], node_devices("mm", 4)), Policy()).node("mm")
    assert report.verdict == "unknown"
    assert "gpu_count_mismatch:catalog=4,label=2" in report.reasons


def test_time_slicing_replicas_are_not_devices() -> None:
    node = gpu_node(
        "ts",
        instance_type="g5.xlarge",
        gpus=4,
        labels={"nvidia.com/gpu.replicas": "4"},
        capacity={"nvidia.com/gpu": "4"},
    )
    report = plan(snapshot([node], [], node_devices("ts", 1)), Policy()).node("ts")
    assert report.verdict == "idle"
    assert report.gpus == 1


def test_unknown_instance_type_uses_labels_and_is_unpriced() -> None:
    node = gpu_node("odd", instance_type="x9.gpu", gpus=2, labels={"nvidia.com/gpu.count": "2"})
    report = plan(snapshot([node], [], node_devices("odd", 2)), Policy()).node("odd")
    assert report.verdict == "unknown"
    assert "power_ceiling_unknown:x9.gpu" in report.reasons
    assert report.reasons[-1] == "price_unknown:x9.gpu"
    assert report.hourly_usd is None and report.gpus == 2


def test_policy_power_ceiling_for_unknown_model_is_not_enough_without_catalog_row() -> None:
    node = gpu_node("ok", instance_type="g6.xlarge", gpus=1)
    report = plan(snapshot([node], [], node_devices("ok", 1, power=jitter(20, 1))), Policy()).node("ok")
    assert report.verdict == "idle" and report.hourly_usd is not None
    strict = Policy(idle_power_max_w={"NVIDIA L4": 15})
    assert "power_above_idle" in codes(
        plan(snapshot([node], [], node_devices("ok", 1, power=jitter(20, 1))), strict).node("ok").reasons
    )


def test_non_gpu_nodes_are_not_in_the_plan() -> None:
    cpu = gpu_node("cpu-1", instance_type="m5.large", gpus=0, labels={"nvidia.com/gpu.present": "false"})
    cpu["status"]["capacity"].pop("nvidia.com/gpu")
    result = plan(snapshot([cpu], [], {}), Policy())
    assert result.nodes == []


def test_node_without_inventory_is_node_group_unknown() -> None:
    node = gpu_node("ng", instance_type="g5.xlarge", gpus=1)
    result = plan(snapshot([node], [], node_devices("ng", 1), inventory_known=False), Policy())
    assert result.node("ng").verdict == "protected"
    assert verdict_reasons(result.node("ng").reasons) == ["node_group_unknown:no_inventory"]
    assert result.actions == []


def test_standalone_idle_instance_gets_a_recommendation_not_a_scale_in() -> None:
    node = gpu_node("sa", instance_type="g5.xlarge", gpus=1, nodegroup=None)
    result = plan(snapshot([node], [], node_devices("sa", 1), groups=[]), Policy())
    assert result.node("sa").verdict == "idle"
    assert [a.kind for a in result.actions] == ["recommend"]
    assert result.savings.hourly_usd == 0


def test_selection_excludes() -> None:
    node = gpu_node("sel", instance_type="g5.xlarge", gpus=1)
    result = plan(snapshot([node], [], node_devices("sel", 1)), Policy(node_groups=["other"]))
    assert result.node("sel").verdict == "excluded"
    assert result.node("sel").reasons[0] == "not_selected"
    result = plan(snapshot([node], [], node_devices("sel", 1)), Policy(node_selector={"team": "ml"}))
    assert result.node("sel").verdict == "excluded"


def test_spot_and_region_pricing_reasons() -> None:
    node = gpu_node(
        "sp", instance_type="g5.xlarge", gpus=1,
        labels={"eks.amazonaws.com/capacityType": "SPOT", "topology.kubernetes.io/region": "eu-west-1"},
    )  # fmt: skip
    report = plan(snapshot([node], [], node_devices("sp", 1)), Policy()).node("sp")
    assert verdict_reasons(report.reasons) == [
        "idle_window_clean",
        "price_region_fallback:eu-west-1",
        "spot_priced_on_demand",
    ]
    assert report.hourly_usd == pytest.approx(1.006)


def test_young_node_is_unknown() -> None:
    node = gpu_node("young", instance_type="g5.xlarge", gpus=1, created=AT - timedelta(minutes=20))
    report = plan(snapshot([node], [], node_devices("young", 1)), Policy()).node("young")
    assert report.verdict == "unknown"
    assert "node_too_young" in report.reasons


def test_series_of_one_device_that_differ_in_pod_labels_are_merged() -> None:
    # The workload changed mid-window: two series for one UUID, each covering half the window.
    node = gpu_node("mg", instance_type="g5.xlarge", gpus=1)
    first = device_series(
        {"node": "mg", "gpu": "0", "UUID": "U", "pod": "a"}, util=lambda i: 0 if i < 16 else math.nan
    )
    second = device_series(
        {"node": "mg", "gpu": "0", "UUID": "U", "pod": "b"}, util=lambda i: 0 if i >= 16 else math.nan
    )
    metrics = merge_metrics(first, second)
    # Drop the NaN points (absent samples), keep the other metrics of the first series.
    metrics["DCGM_FI_DEV_GPU_UTIL"] = [
        type(s)(s.labels, tuple(t for t, v in zip(s.times, s.values, strict=True) if not math.isnan(v)),
                tuple(v for v in s.values if not math.isnan(v)))
        for s in metrics["DCGM_FI_DEV_GPU_UTIL"]
    ]  # fmt: skip
    report = plan(snapshot([node], [], metrics), Policy()).node("mg")
    assert report.coverage == 1.0
    assert report.verdict == "idle"


def test_asg_min_size_and_unknown_group() -> None:
    node = gpu_node("ms", instance_type="g5.xlarge", gpus=1, instance_id="i-ms")
    at_min = snapshot(
        [node], [], node_devices("ms", 1), groups=[asg("g1", ["i-ms"], min_size=1, nodegroup="gpu-a10g")]
    )
    report = plan(at_min, Policy()).node("ms")
    assert report.verdict == "protected"
    assert verdict_reasons(report.reasons) == ["node_group_at_min_size:gpu-a10g=1"]
    gone = snapshot([node], [], node_devices("ms", 1), groups=[])
    gone.inventory.asg_of_instance["i-ms"] = "deleted-asg"
    assert verdict_reasons(plan(gone, Policy()).node("ms").reasons) == ["node_group_unknown:deleted-asg"]


def test_rfc_helper_roundtrip() -> None:
    assert rfc(AT) == "2026-11-02T10:00:00Z"


@pytest.mark.parametrize("state", ["Terminating", "Terminating:Wait", "Standby", "Detaching"])
def test_instance_the_asg_is_already_acting_on_is_left_alone(state: str) -> None:
    node = gpu_node("tx", instance_type="g5.xlarge", gpus=1, instance_id="i-tx")
    group = asg("g1", ["i-tx", "i-other"], nodegroup="gpu-a10g")
    group.instances["i-tx"] = state
    result = plan(snapshot([node], [], node_devices("tx", 1), groups=[group]), Policy())
    assert result.node("tx").verdict == "protected"
    assert verdict_reasons(result.node("tx").reasons) == [f"other_autoscaler:asg_lifecycle_{state}"]
    assert result.actions == []
