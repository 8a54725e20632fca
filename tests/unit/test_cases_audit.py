"""Cases audit: other inputs of the fault classes named in tests/fixtures/cases/README.md.

The case tests (``test_cases_decide.py``, ``test_drain.py``, ``test_webhook.py``, ``test_periods.py`` …)
turn each case's own input into a fixture. These tests try *neighbouring* inputs of the same fault class,
as an evaluator would, and go through the snapshot-directory adapter wherever the fault lives in the
wire format (``"+Inf"`` strings, ``warnings``, ``status: error``, a vector instead of a matrix).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.domain.periods import Period, schedule_contains
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.ports import EvictionOutcome
from tests.builders import (
    AT,
    asg,
    const,
    device_series,
    exporter_pod,
    gpu_node,
    merge_metrics,
    node_devices,
    pod,
    rfc,
    snapshot,
    times,
    write_snapshot_dir,
)
from tests.unit.test_drain import ASG, make_world, reasons

WIDE = Policy(max_nodes_per_run=10, max_nodes_per_node_group=10)


def codes(reasons_: list[str]) -> list[str]:
    return [r.split(":", 1)[0] for r in reasons_]


# ================================================================ metric-to-node identity (BUG-01 class)


def _labels_without_node(**extra: str) -> dict[str, str]:
    return {"gpu": "0", "UUID": "GPU-id-0", **extra}


def test_hostnetwork_exporter_instance_equal_to_node_ip_joins_once() -> None:
    # hostNetwork exporter: its pod IP *is* the node's InternalIP — two methods, one node: not ambiguous.
    node = gpu_node("gpu-hn", instance_type="g5.xlarge", gpus=1, ip="10.1.2.3")
    exporter = exporter_pod("gpu-hn", "10.1.2.3", "nvidia-dcgm-exporter-hn")
    exporter["spec"]["hostNetwork"] = True
    metrics = device_series(_labels_without_node(instance="10.1.2.3:9400", Hostname="gpu-hn"))
    result = plan(snapshot([node], [exporter], metrics), Policy())
    assert result.unmapped == []
    assert result.node("gpu-hn").verdict == "idle"


def test_kubernetes_node_label_alone_joins() -> None:
    node = gpu_node("gpu-kn", instance_type="g5.xlarge", gpus=1)
    metrics = device_series(_labels_without_node(kubernetes_node="gpu-kn", Hostname="localhost"))
    result = plan(snapshot([node], [], metrics), Policy())
    assert result.unmapped == []
    assert result.node("gpu-kn").verdict == "idle"


def test_exported_pod_labels_join_through_the_workload_pods_node() -> None:
    # honor_labels=false renames the workload labels to exported_*; the pod's spec.nodeName names the node.
    node = gpu_node("gpu-ep", instance_type="g5.xlarge", gpus=1)
    worker = pod("infer-0", "gpu-ep", namespace="ml")
    metrics = device_series(
        _labels_without_node(exported_namespace="ml", exported_pod="infer-0", Hostname="dcgm-exporter-x1")
    )
    result = plan(snapshot([node], [worker], metrics), Policy(evict_idle_gpu_holders=True))
    assert result.unmapped == []
    assert result.node("gpu-ep").coverage == 1.0


def test_exported_pod_on_another_node_than_the_instance_ip_is_unmapped() -> None:
    a = gpu_node("gpu-a", instance_type="g5.xlarge", gpus=1, ip="10.0.0.1")
    b = gpu_node("gpu-b", instance_type="g5.xlarge", gpus=1, ip="10.0.0.2")
    worker = pod("infer-0", "gpu-b", namespace="ml")
    metrics = device_series(_labels_without_node(instance="10.0.0.1:9400", exported_namespace="ml",
                                                 exported_pod="infer-0"))  # fmt: skip
    result = plan(snapshot([a, b], [worker], metrics), WIDE)
    assert {u.reason for u in result.unmapped} == {"series_unmapped:ambiguous:gpu-a,gpu-b"}
    assert result.node("gpu-a").verdict == "unknown"
    assert [x for x in result.actions if x.kind == "scale_in" and x.node == "gpu-a"] == []


def test_node_label_contradicting_instance_ip_is_unmapped() -> None:
    a = gpu_node("gpu-a", instance_type="g5.xlarge", gpus=1, ip="10.0.0.1")
    b = gpu_node("gpu-b", instance_type="g5.xlarge", gpus=1, ip="10.0.0.2")
    metrics = merge_metrics(
        device_series({"node": "gpu-a", "instance": "10.0.0.2:9400", "gpu": "0", "UUID": "GPU-a"}),
        device_series({"node": "gpu-b", "instance": "10.0.0.2:9400", "gpu": "0", "UUID": "GPU-b"}),
    )
    result = plan(snapshot([a, b], [], metrics), WIDE)
    assert result.node("gpu-a").verdict == "unknown"
    assert "series_unmapped" in codes(result.node("gpu-a").reasons)
    # gpu-b's own exporter sent the contradictory series: unknown is the safe reading for it too.
    assert result.node("gpu-b").verdict in ("idle", "unknown")
    assert "gpu-a" not in {x.node for x in result.actions if x.kind == "scale_in"}


def test_configured_node_label_joins() -> None:
    node = gpu_node("gpu-cf", instance_type="g5.xlarge", gpus=1)
    metrics = device_series(_labels_without_node(k8s_node_name="gpu-cf"))
    assert plan(snapshot([node], [], metrics), Policy()).node("gpu-cf").verdict == "unknown"
    result = plan(snapshot([node], [], metrics), Policy(), node_label="k8s_node_name")
    assert result.node("gpu-cf").verdict == "idle"


def test_ipv6_instance_joins_the_node_internal_ip() -> None:
    node = gpu_node("gpu-v6", instance_type="g5.xlarge", gpus=1, ip="fd00::12")
    metrics = device_series(_labels_without_node(instance="[fd00::12]:9400"))
    assert plan(snapshot([node], [], metrics), Policy()).node("gpu-v6").verdict == "idle"


def test_ip_of_a_finished_pod_does_not_join() -> None:
    # A Succeeded pod keeps its old podIP in status; the IP may now belong to another pod elsewhere.
    node = gpu_node("gpu-f", instance_type="g5.xlarge", gpus=1, ip="10.0.9.9")
    done = exporter_pod("gpu-f", "10.244.1.7", "nvidia-dcgm-exporter-old")
    done["status"]["phase"] = "Succeeded"
    metrics = device_series(_labels_without_node(instance="10.244.1.7:9400"))
    result = plan(snapshot([node], [done], metrics), Policy())
    assert result.node("gpu-f").verdict == "unknown"
    assert {u.reason for u in result.unmapped} == {"series_unmapped:no_match"}


def test_one_unmapped_device_of_a_multi_gpu_node_makes_it_unknown() -> None:
    node = gpu_node("gpu-4", instance_type="g5.12xlarge", gpus=4)
    metrics = node_devices("gpu-4", 4)
    for name in metrics:  # GPU 3's series lose their node label: Hostname=localhost only
        s = metrics[name][3]
        labels = {k: v for k, v in s.labels.items() if k not in ("node", "Hostname")}
        metrics[name][3] = type(s)({**labels, "Hostname": "localhost"}, s.times, s.values)
    result = plan(snapshot([node], [], metrics), Policy())
    assert result.node("gpu-4").verdict == "unknown"
    assert "no_series:1_of_4_devices" in result.node("gpu-4").reasons
    assert result.actions == [] or all(a.kind != "scale_in" for a in result.actions)


# ============================================================ device mode and units (MIG, BUG-02 class)


def test_mig_single_strategy_all_instances_idle_by_prof_is_idle_and_busy_by_prof_is_busy() -> None:
    node = gpu_node(
        "mig-s", instance_type="p4d.24xlarge", gpus=16,
        labels={"nvidia.com/mig.strategy": "single", "nvidia.com/mig.config": "all-3g.20gb"},
    )  # fmt: skip

    def metrics(active: float) -> dict[str, Any]:
        parts = []
        for g in range(8):
            parent = {"node": "mig-s", "gpu": str(g), "UUID": f"GPU-m{g}"}
            parts.append(device_series(parent, util=None))  # physical: FB, power, energy
            for gi in ("1", "2"):
                parts.append(device_series({**parent, "GPU_I_ID": gi}, util=const(0),
                                           prof=const(active if (g, gi) == (5, "2") else 0.0),
                                           fb_used=None, power=None, energy=None))  # fmt: skip
        return merge_metrics(*parts)

    # The p4d family's default warm floor would keep the only node whatever its evidence: off here, where
    # the question is how MIG instances are read.
    policy = Policy(warm_floor={"p4d": 0})
    idle = plan(snapshot([node], [], metrics(0.0)), policy).node("mig-s")
    assert idle.verdict == "idle", idle.reasons
    # 0.06 is 6 %: above the 5 % threshold (a ratio compared as percent would read 0.06 % = idle).
    busy = plan(snapshot([node], [], metrics(0.06)), policy).node("mig-s")
    assert busy.verdict in ("busy", "underutilized")
    assert busy.gpu_activity_max_pct == pytest.approx(6.0)


def test_mig_single_strategy_with_only_gpu_util_is_unknown() -> None:
    node = gpu_node(
        "mig-u", instance_type="p4d.24xlarge", gpus=8,
        labels={"nvidia.com/mig.strategy": "single", "nvidia.com/mig.config": "all-7g.40gb"},
    )  # fmt: skip
    parts = []
    for g in range(8):
        parent = {"node": "mig-u", "gpu": str(g), "UUID": f"GPU-u{g}"}
        parts.append(device_series({**parent, "GPU_I_ID": "0"}, util=const(0)))
    report = plan(snapshot([node], [], merge_metrics(*parts)), Policy()).node("mig-u")
    assert report.verdict == "unknown"
    assert "no_series" in codes(report.reasons)


def test_prof_ratio_on_a_full_gpu_is_scaled_to_percent() -> None:
    # PROF 0.3 = 30 % with GPU_UTIL missing: busy, never "0.3 % ≤ 5 %".
    node = gpu_node("pr", instance_type="g5.xlarge", gpus=1)
    report = plan(snapshot([node], [], node_devices("pr", 1, util=None, prof=const(0.3))), Policy()).node(
        "pr"
    )
    assert report.verdict in ("busy", "underutilized")
    assert report.gpu_activity_max_pct == pytest.approx(30.0)


# ================================================================ single-signal idleness (BUG-03 class)


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"util": const(0), "prof": const(0.0), "fb_used": const(30000)}, "fb_above_threshold"),
        ({"util": const(0), "prof": const(0.0), "power": const(300)}, "power_above_idle"),
        ({"util": const(97), "prof": const(0.0)}, "activity_above_threshold"),
        ({"util": const(0), "prof": const(0.97)}, "activity_above_threshold"),
    ],
)
def test_any_one_signal_above_its_threshold_is_busy(override: dict[str, Any], code: str) -> None:
    node = gpu_node("ss", instance_type="g5.xlarge", gpus=1)
    report = plan(snapshot([node], [], node_devices("ss", 1, **override)), Policy()).node("ss")
    assert report.verdict in ("busy", "underutilized")
    assert code in codes(report.reasons)


def test_busy_on_one_step_of_one_device_of_eight_is_busy() -> None:
    node = gpu_node("one", instance_type="p4d.24xlarge", gpus=8)
    metrics = node_devices(  # A100 40 GB: the driver reports 40,536 MiB used + free
        "one", 8, fb_total=40536, per_gpu={6: {"util": lambda i: 80.0 if i == 17 else 0.0}}
    )
    report = plan(snapshot([node], [], metrics), Policy()).node("one")
    assert report.verdict in ("busy", "underutilized")


def test_thresholds_are_inclusive() -> None:
    node = gpu_node("eq", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("eq", 1, util=const(5.0), fb_used=const(1024.0))
    assert plan(snapshot([node], [], metrics), Policy()).node("eq").verdict == "idle"


# ============================================================ stale / frozen data (BUG-04 class)


def test_old_timestamp_file_through_the_adapter_is_stale(tmp_path: Path) -> None:
    node = gpu_node("st", instance_type="g5.xlarge", gpus=1)
    root = write_snapshot_dir(tmp_path / "snap", [node], [], node_devices("st", 1))
    stamp = (AT - timedelta(minutes=9)).timestamp()
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"node": "st", "gpu": "0", "UUID": "GPU-st-0"},
         "values": [[t, repr(stamp)] for t in times()]}]}}  # fmt: skip
    (root / "metrics" / "DCGM_FI_DEV_GPU_UTIL.timestamp.json").write_text(json.dumps(body))
    report = plan(load_snapshot(root), Policy()).node("st")
    assert report.verdict == "unknown"
    assert "stale_metrics:540s" in report.reasons


def test_lookback_stretched_matrix_with_timestamps_is_stale() -> None:
    # The exporter stopped at at-8m; Prometheus' 5-minute lookback repeats the last value until at-3m.
    node = gpu_node("lb", instance_type="g5.xlarge", gpus=1)
    last = AT.timestamp() - 480
    ts = [t for t in times() if t <= last + 300]
    metrics = node_devices("lb", 1, ts=ts, power=lambda i: 27.0 + (i % 3 if i < len(ts) - 5 else 0))
    stamps = {
        "DCGM_FI_DEV_GPU_UTIL": device_series(
            {"node": "lb", "gpu": "0", "UUID": "GPU-lb-0"},
            util=lambda i: min(ts[i], last),
            ts=ts,
        )["DCGM_FI_DEV_GPU_UTIL"]
    }
    report = plan(snapshot([node], [], metrics, timestamps=stamps), Policy()).node("lb")
    assert report.verdict == "unknown"
    assert "stale_metrics:480s" in report.reasons


def test_matrix_that_ends_early_without_timestamps_is_never_idle() -> None:
    # Without timestamp(): the newest matrix point is 5 minutes old and 5 of 30 steps are missing.
    node = gpu_node("early", instance_type="g5.xlarge", gpus=1)
    ts = [t for t in times() if t <= AT.timestamp() - 300]
    report = plan(snapshot([node], [], node_devices("early", 1, ts=ts)), Policy()).node("early")
    assert report.verdict == "unknown"


def test_frozen_util_and_power_with_a_moving_energy_counter_of_another_gpu_is_unknown() -> None:
    # One GPU of two is frozen: the node is unknown even though the other GPU's counter moves.
    node = gpu_node("fz", instance_type="g5.12xlarge", gpus=4)
    metrics = node_devices("fz", 4, per_gpu={2: {"energy": "frozen"}})
    report = plan(snapshot([node], [], metrics), Policy()).node("fz")
    assert report.verdict == "unknown"
    assert "exporter_frozen" in codes(report.reasons)


def test_up_zero_with_series_still_present_is_unknown() -> None:
    node = gpu_node("up0", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("up0", 1)
    metrics["up"] = device_series({"node": "up0"}, util=const(0))["DCGM_FI_DEV_GPU_UTIL"]
    report = plan(snapshot([node], [], metrics), Policy()).node("up0")
    assert report.verdict == "unknown"
    assert report.coverage == 0.0


# ============================================ non-finite values through the wire format ("+Inf" strings)


def _write_raw(root: Path, name: str, result: list[dict[str, Any]], **top: Any) -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}, **top}
    (root / "metrics" / f"{name}.json").write_text(json.dumps(body))


def _poison(root: Path, name: str, token: str, *, index: int = 12) -> None:
    path = root / "metrics" / f"{name}.json"
    body = json.loads(path.read_text())
    for item in body["data"]["result"]:
        item["values"][index][1] = token
    path.write_text(json.dumps(body))


METRICS_ALL = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "up",
)


def _inf_snapshot_dir(tmp_path: Path) -> Path:
    node = gpu_node("inf", instance_type="g5.xlarge", gpus=1)
    metrics = node_devices("inf", 1, prof=const(0.01))
    metrics["up"] = device_series({"node": "inf"}, util=const(1))["DCGM_FI_DEV_GPU_UTIL"]
    return write_snapshot_dir(tmp_path / "snap", [node], [], metrics)


def test_inf_fixture_is_idle_when_clean(tmp_path: Path) -> None:
    assert plan(load_snapshot(_inf_snapshot_dir(tmp_path)), Policy()).node("inf").verdict == "idle"


@pytest.mark.parametrize("metric", METRICS_ALL)
@pytest.mark.parametrize("token", ["+Inf", "-Inf", "NaN"])
def test_non_finite_string_in_any_metric_is_unknown(tmp_path: Path, metric: str, token: str) -> None:
    root = _inf_snapshot_dir(tmp_path)
    _poison(root, metric, token)
    result = plan(load_snapshot(root), Policy())
    report = result.node("inf")
    assert report.verdict == "unknown", (metric, token, report.reasons)
    assert [a for a in result.actions if a.kind == "scale_in"] == []
    for figure in (report.gpu_activity_max_pct, report.fb_used_max_mib, report.coverage):
        assert figure is None or math.isfinite(figure)


@pytest.mark.parametrize("token", ["+Inf", "NaN"])
def test_non_finite_raw_timestamp_is_unknown(tmp_path: Path, token: str) -> None:
    root = _inf_snapshot_dir(tmp_path)
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"node": "inf", "gpu": "0", "UUID": "GPU-inf-0"},
         "values": [[t, token] for t in times()]}]}}  # fmt: skip
    (root / "metrics" / "DCGM_FI_DEV_GPU_UTIL.timestamp.json").write_text(json.dumps(body))
    report = plan(load_snapshot(root), Policy()).node("inf")
    assert report.verdict == "unknown", report.reasons


def test_plan_json_of_a_non_finite_snapshot_is_strict_json(tmp_path: Path) -> None:
    root = _inf_snapshot_dir(tmp_path)
    for metric in METRICS_ALL:
        _poison(root, metric, "+Inf", index=30)
    doc = plan(load_snapshot(root), Policy()).to_json_dict()
    text = json.dumps(doc, allow_nan=False)  # raises on inf/nan
    assert "Infinity" not in text


# ======================================================== partial responses through the adapter (BUG-05)


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "success", "warnings": ["query hit the 11000 point limit"],
         "data": {"resultType": "matrix", "result": []}},
        {"status": "error", "errorType": "timeout", "error": "query timed out"},
        {"status": "success", "data": {"resultType": "vector", "result": []}},
        {"status": "success", "data": {"resultType": "matrix"}},
        {"status": "success"},
        [],
        "not json at all",
    ],
)  # fmt: skip
@pytest.mark.parametrize(
    "metric", ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "up"]
)
def test_unusable_metrics_file_makes_gpu_nodes_unknown(tmp_path: Path, answer: Any, metric: str) -> None:
    root = _inf_snapshot_dir(tmp_path)
    path = root / "metrics" / f"{metric}.json"
    path.write_text(answer if isinstance(answer, str) else json.dumps(answer))
    result = plan(load_snapshot(root), Policy())
    report = result.node("inf")
    assert report.verdict == "unknown"
    assert f"partial_response:{metric}" in report.reasons
    assert result.actions == []


def test_warnings_with_a_complete_looking_result_still_partial(tmp_path: Path) -> None:
    root = _inf_snapshot_dir(tmp_path)
    path = root / "metrics" / "DCGM_FI_DEV_GPU_UTIL.json"
    body = json.loads(path.read_text())
    body["warnings"] = ["PromQL info: some series were dropped"]
    path.write_text(json.dumps(body))
    assert "partial_response:DCGM_FI_DEV_GPU_UTIL" in plan(load_snapshot(root), Policy()).node("inf").reasons


def test_malformed_sample_is_partial_not_a_crash(tmp_path: Path) -> None:
    root = _inf_snapshot_dir(tmp_path)
    _poison(root, "DCGM_FI_DEV_FB_USED", "twelve")
    report = plan(load_snapshot(root), Policy()).node("inf")
    assert report.verdict == "unknown"


def test_empty_matrix_for_a_node_is_no_series(tmp_path: Path) -> None:
    root = _inf_snapshot_dir(tmp_path)
    _write_raw(root, "DCGM_FI_DEV_GPU_UTIL", [])
    _write_raw(root, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", [])
    report = plan(load_snapshot(root), Policy()).node("inf")
    assert report.verdict == "unknown"
    assert "no_series" in codes(report.reasons)


# ======================================================== absence of attribution (BUG-06 class)


@pytest.mark.parametrize(
    "holder",
    [
        {"extra_spec": {"runtimeClassName": "nvidia-cdi"}},
        {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0a1b"}]},
        {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
    ],
)
def test_gpu_used_without_a_gpu_request_is_never_idle_by_attribution(holder: dict[str, Any]) -> None:
    # Empty pod labels, framebuffer used: busy by memory, and the holder is named.
    node = gpu_node("at", instance_type="g5.xlarge", gpus=1)
    user = pod("embed-0", "at", namespace="search", **holder)
    metrics = node_devices("at", 1, util=const(3), fb_used=const(15872))
    report = plan(snapshot([node], [user], metrics), Policy()).node("at")
    assert report.verdict in ("busy", "underutilized")
    assert "idle_gpu_holder:search/embed-0" in report.reasons


def test_init_container_gpu_request_is_a_holder() -> None:
    node = gpu_node("ic", instance_type="g5.xlarge", gpus=1)
    p = pod("warm-0", "ic")
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    report = plan(snapshot([node], [p], node_devices("ic", 1)), Policy()).node("ic")
    assert report.verdict == "protected"
    assert "idle_gpu_holder:default/warm-0" in report.reasons


# =================================================== node group invariants (BUG-23 class) in the planner


def _group_world(n: int, *, min_size: int, desired: int, max_size: int) -> Any:
    nodes = [gpu_node(f"g{i}", instance_type="g5.xlarge", gpus=1, instance_id=f"i-{i}") for i in range(n)]
    metrics = merge_metrics(*(node_devices(f"g{i}", 1) for i in range(n)))
    group = asg("asg-1", [f"i-{i}" for i in range(n)], min_size=min_size, desired=desired,
                max_size=max_size, nodegroup="gpu-a10g")  # fmt: skip
    return snapshot(nodes, [], metrics, groups=[group])


def test_scale_in_chain_stops_at_min_size() -> None:
    result = plan(_group_world(4, min_size=2, desired=4, max_size=6), WIDE)
    chain = [(a.from_, a.to) for a in result.actions if a.kind == "scale_in"]
    assert chain == [(4, 3), (3, 2)]


def test_desired_at_min_protects_every_node() -> None:
    result = plan(_group_world(2, min_size=2, desired=2, max_size=4), WIDE)
    assert {n.verdict for n in result.nodes} == {"protected"}
    assert [a for a in result.actions if a.kind == "scale_in"] == []


def test_desired_above_max_never_scales_in_below_min() -> None:
    # An inconsistent ASG (desired > max, e.g. mid-update) must not lead to a chain below MinSize.
    result = plan(_group_world(3, min_size=2, desired=7, max_size=3), WIDE)
    for a in result.actions:
        if a.kind == "scale_in":
            assert a.to >= 2


def test_percent_node_group_budget_rounds_up() -> None:
    result = plan(_group_world(5, min_size=0, desired=5, max_size=5),
                  Policy(max_nodes_per_run=10, max_nodes_per_node_group="30%"))  # fmt: skip
    assert len([a for a in result.actions if a.kind == "scale_in"]) == 2  # ceil(0.3 × 5)


# ======================================================== eviction error classification in the drain


def test_drain_404_counts_as_gone_and_finishes() -> None:
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30)])
    world.writer.script_eviction("default", "web-1", EvictionOutcome("gone", 'pods "web-1" not found'))
    world.writer.remove_pod("default", "web-1")
    record = world.drain()
    assert record.status == "succeeded", reasons(world)
    assert world.scaler.terminated == ["i-1"]


def test_drain_429_with_retry_after_keeps_retrying_until_it_clears() -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", grace=30)])
    blocked = EvictionOutcome(
        "blocked", "Cannot evict pod as it would violate the pod's disruption budget.", 20
    )
    world.writer.script_eviction("default", "infer-0", blocked, blocked, blocked)
    assert world.drain().status == "succeeded"
    assert world.scaler.terminated == ["i-1"]


def test_drain_500_once_then_accepted_succeeds() -> None:
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30)])
    world.writer.script_eviction(
        "default", "web-1", EvictionOutcome("error", "etcdserver: request timed out")
    )
    assert world.drain().status == "succeeded"


def test_drain_409_namesake_that_is_a_bare_pod_rolls_back() -> None:
    # 409: the UID we meant is gone, a namesake replaced it; it is re-classified — a bare pod blocks.
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30)])
    world.writer.script_eviction("default", "web-1", EvictionOutcome("uid_mismatch", "Precondition failed"))
    original_list = world.writer.list_pods_on_node
    swapped = [False]

    def list_pods_on_node(node: str) -> list[dict[str, Any]]:
        items = original_list(node)
        if swapped[0]:
            return [_bare_namesake(p) if p["metadata"]["name"] == "web-1" else p for p in items]
        if any(c[0] == "evict" for c in world.writer.calls):
            swapped[0] = True
            return [_bare_namesake(p) if p["metadata"]["name"] == "web-1" else p for p in items]
        return items

    world.writer.list_pods_on_node = list_pods_on_node  # type: ignore[method-assign]
    record = world.drain()
    assert record.status in ("rolled_back", "abandoned"), reasons(world)
    assert world.scaler.terminated == []
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False


def _bare_namesake(p: dict[str, Any]) -> dict[str, Any]:
    q = json.loads(json.dumps(p))
    q["metadata"]["uid"] = "uid-new-namesake"
    q["metadata"].pop("ownerReferences", None)
    return q


def test_drain_persistent_429_never_terminates() -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", grace=30)])
    blocked = EvictionOutcome("blocked", "disruption budget", 5)
    world.writer.script_eviction("default", "infer-0", *([blocked] * 2000))
    record = world.drain()
    assert record.status == "rolled_back"
    assert world.scaler.terminated == []
    assert world.scaler.describe_group(ASG).sizes.desired == 3


# ================================================================ windows: every period edge (BUG-29)

NIGHT = Period(days=["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], start="22:30", end="06:00",
               timezone="Europe/Berlin")  # fmt: skip
EVENING = Period(days=["Fri"], start="18:00", end="00:00", timezone="America/New_York")


def _local(zone: str, *args: int) -> datetime:
    from zoneinfo import ZoneInfo

    return datetime(*args, tzinfo=ZoneInfo(zone))  # type: ignore[arg-type,misc]


@pytest.mark.parametrize(
    ("period", "instant", "active"),
    [
        (NIGHT, ("Europe/Berlin", 2026, 3, 4, 22, 29, 59, 999999), False),
        (NIGHT, ("Europe/Berlin", 2026, 3, 4, 22, 30), True),
        (NIGHT, ("Europe/Berlin", 2026, 3, 4, 23, 59, 59), True),
        (NIGHT, ("Europe/Berlin", 2026, 3, 5, 0, 0), True),
        (NIGHT, ("Europe/Berlin", 2026, 3, 5, 5, 59, 59, 999999), True),
        (NIGHT, ("Europe/Berlin", 2026, 3, 5, 6, 0), False),
        (EVENING, ("America/New_York", 2026, 3, 6, 17, 59, 59), False),
        (EVENING, ("America/New_York", 2026, 3, 6, 18, 0), True),
        (EVENING, ("America/New_York", 2026, 3, 6, 23, 59, 59, 999999), True),
        (EVENING, ("America/New_York", 2026, 3, 7, 0, 0), False),
        (EVENING, ("America/New_York", 2026, 3, 13, 23, 30), True),  # a week later, still Friday
        (EVENING, ("America/New_York", 2026, 3, 7, 18, 30), False),  # Saturday
    ],
)
def test_every_period_edge(period: Period, instant: tuple[Any, ...], active: bool) -> None:
    at = _local(*instant)
    assert schedule_contains([period], at) is active
    assert schedule_contains([period], at.astimezone(UTC)) is active


def test_rfc_helper_available() -> None:
    assert rfc(AT).endswith("Z")
