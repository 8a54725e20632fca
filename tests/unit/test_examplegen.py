"""The example-snapshot generator: deterministic, in the docs/architecture.md §5 snapshot contract, faithful to DCGM."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rightsizer.domain.verdicts import REASON_CODES, order_reasons, verdict_of
from tests.support import examplegen
from tests.support.examplegen import DCGM_METRICS, DEFAULT_TAKEN_AT, METRIC_FILES, generate_snapshot

COMMITTED_DEMO = (
    Path(__file__).resolve().parents[2] / "functions" / "rightsizer" / "data" / "examples" / "demo"
)
REQUIRED = ("snapshot.json", "nodes.json", "pods.json")
OPTIONAL = ("pdbs.json", "nodegroups.json", "instances.json")
TIMESTAMP_FILE = "metrics/DCGM_FI_DEV_GPU_UTIL.timestamp.json"
VERDICTS = {"excluded", "unknown", "busy", "underutilized", "protected", "idle"}


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def _load(directory: Path, name: str) -> Any:
    return json.loads((directory / name).read_text(encoding="utf-8"))


def _series(directory: Path, metric: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _load(directory, f"metrics/{metric}.json")["data"]["result"]
    return result


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_snapshot(tmp_path_factory.mktemp("demo") / "snap")


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_snapshot(tmp_path_factory.mktemp("scale") / "snap", scenario="scale", nodes=100, seed=3)


@pytest.fixture(scope="module")
def expected(demo: Path) -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = _load(demo, "expected.json")
    return loaded


def _node_of(expected: dict[str, dict[str, Any]], code: str) -> str:
    return next(name for name, e in sorted(expected.items()) if code in e["reasons_include"])


# --- determinism -------------------------------------------------------------------------------------------


def test_same_arguments_give_byte_identical_files(demo: Path, tmp_path: Path) -> None:
    # GIVEN a demo generated once WHEN it is generated again with the same arguments
    again = generate_snapshot(tmp_path / "again")
    # THEN every file is byte-identical
    assert _files(again) == _files(demo)


def test_scale_is_deterministic_too(scale: Path, tmp_path: Path) -> None:
    assert _files(generate_snapshot(tmp_path / "s", scenario="scale", nodes=100, seed=3)) == _files(scale)


def test_committed_demo_is_what_the_generator_produces(demo: Path) -> None:
    # The committed example must never drift from the code: regenerate it with
    # `python -m tests.support.examplegen --out functions/rightsizer/data/examples/demo`.
    assert _files(COMMITTED_DEMO) == _files(demo)


def test_another_seed_changes_values_not_shape(demo: Path, tmp_path: Path) -> None:
    other = generate_snapshot(tmp_path / "other", seed=8)
    assert _files(other).keys() == _files(demo).keys()
    assert (other / "metrics/DCGM_FI_DEV_POWER_USAGE.json").read_bytes() != (
        demo / "metrics/DCGM_FI_DEV_POWER_USAGE.json"
    ).read_bytes()


def test_sources_are_read_from_the_repository_only() -> None:
    sources = examplegen.sources_dir()
    assert sources == Path(__file__).resolve().parents[1] / "fixtures" / "sources"
    assert (sources / "PROVENANCE.md").is_file()


# --- contract shape (docs/architecture.md §5) ----------------------------------------------------------------------------


def test_every_contract_file_is_present(demo: Path) -> None:
    for name in (*REQUIRED, *OPTIONAL, *(f"metrics/{m}.json" for m in METRIC_FILES), TIMESTAMP_FILE):
        assert (demo / name).is_file(), name


def test_snapshot_json_shape(demo: Path) -> None:
    snap = _load(demo, "snapshot.json")
    assert snap == {
        "cluster": "demo-cluster",
        "region": "us-east-1",
        "step_seconds": 60,
        "taken_at": "2026-11-02T10:00:00Z",
        "window_seconds": 1800,
    }


@pytest.mark.parametrize("name", ["nodes.json", "pods.json", "pdbs.json"])
def test_kubernetes_files_are_kubectl_lists(demo: Path, name: str) -> None:
    doc = _load(demo, name)
    assert doc["apiVersion"] == "v1"
    assert doc["kind"] == "List"
    assert isinstance(doc["items"], list)
    assert doc["items"]
    kind = {"nodes.json": "Node", "pods.json": "Pod", "pdbs.json": "PodDisruptionBudget"}[name]
    assert {item["kind"] for item in doc["items"]} == {kind}


def test_nodes_are_consistent_eks_nodes(demo: Path) -> None:
    for node in _load(demo, "nodes.json")["items"]:
        meta, status = node["metadata"], node["status"]
        labels = meta["labels"]
        instance_id = node["spec"]["providerID"].rsplit("/", 1)[1]
        assert node["spec"]["providerID"] == f"aws:///{labels['topology.kubernetes.io/zone']}/{instance_id}"
        assert instance_id.startswith("i-0")
        assert labels["topology.kubernetes.io/region"] == "us-east-1"
        assert labels["kubernetes.io/hostname"] == meta["name"]
        internal = [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"]
        assert meta["name"] == "ip-" + internal[0].replace(".", "-") + ".ec2.internal"
        created = datetime.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%S%z")
        assert DEFAULT_TAKEN_AT - created > timedelta(days=1)  # older than the idle window
        for resource, quantity in status["capacity"].items():
            if resource.startswith("nvidia.com/"):
                assert status["allocatable"][resource] == quantity


def test_dcgm_exporter_daemonset_pods_are_the_scrape_targets(demo: Path) -> None:
    pods = _load(demo, "pods.json")["items"]
    exporters = {
        p["status"]["podIP"]: p
        for p in pods
        if p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
        and p["metadata"]["name"].startswith("nvidia-dcgm-exporter-")
    }
    up = _series(demo, "up")
    assert up
    for series in up:
        labels = series["metric"]
        pod = exporters[labels["instance"].rsplit(":", 1)[0]]
        assert pod["spec"]["nodeName"] == labels["node"]
        assert pod["metadata"]["name"] == labels["pod"]


def test_pod_names_are_unique_per_namespace(scale: Path) -> None:
    pods = _load(scale, "pods.json")["items"]
    keys = Counter((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods)
    assert max(keys.values()) == 1


@pytest.mark.parametrize("metric", [*METRIC_FILES, "DCGM_FI_DEV_GPU_UTIL.timestamp"])
def test_metrics_are_query_range_matrices_on_the_step_grid(demo: Path, metric: str) -> None:
    doc = _load(demo, f"metrics/{metric}.json")
    assert doc["status"] == "success"
    assert "warnings" not in doc
    assert doc["data"]["resultType"] == "matrix"
    end = DEFAULT_TAKEN_AT.timestamp()
    grid = [end - 1800 + 60 * i for i in range(1800 // 60 + 1)]  # both window ends, like Prometheus 2.x
    assert doc["data"]["result"]
    for series in doc["data"]["result"]:
        if metric.endswith(".timestamp"):
            assert "__name__" not in series["metric"]  # timestamp() drops the metric name
        else:
            assert series["metric"]["__name__"] == metric
        stamps = [ts for ts, _ in series["values"]]
        assert all(isinstance(ts, (int, float)) for ts in stamps)
        assert all(isinstance(v, str) for _, v in series["values"])
        assert stamps == grid


def test_dcgm_series_carry_the_real_label_set(demo: Path) -> None:
    wanted = {"gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname", "DCGM_FI_DRIVER_VERSION"}
    wanted |= {"instance", "job", "node", "namespace", "pod", "container"}
    for metric in DCGM_METRICS:
        for series in _series(demo, metric):
            assert wanted <= series["metric"].keys(), metric


def test_hostname_is_the_exporter_pod_on_some_nodes(demo: Path) -> None:
    hostnames = {s["metric"]["node"]: s["metric"]["Hostname"] for s in _series(demo, "DCGM_FI_DEV_GPU_UTIL")}
    as_pod = {node for node, host in hostnames.items() if host.startswith("nvidia-dcgm-exporter-")}
    assert as_pod
    assert as_pod != hostnames.keys()  # and the node name on others


def test_raw_sample_times_lag_the_steps_by_under_one_scrape_interval(demo: Path) -> None:
    for series in _load(demo, TIMESTAMP_FILE)["data"]["result"]:
        for ts, raw in series["values"]:
            lag = ts - float(raw)
            assert 0 < lag < 15
        assert float(series["values"][-1][1]) <= DEFAULT_TAKEN_AT.timestamp()


# --- behaviours the demo promises --------------------------------------------------------------------------


def test_energy_moves_on_live_devices_and_is_flat_on_the_frozen_one(
    demo: Path, expected: dict[str, dict[str, Any]]
) -> None:
    frozen = _node_of(expected, "exporter_frozen")
    seen_frozen = 0
    for series in _series(demo, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        energy = [int(v) for _, v in series["values"]]
        if series["metric"]["node"] == frozen:
            seen_frozen += 1
            assert len(set(energy)) == 1
        else:
            assert all(b > a for a, b in itertools.pairwise(energy))
    assert seen_frozen == 1
    power = [s for s in _series(demo, "DCGM_FI_DEV_POWER_USAGE") if s["metric"]["node"] == frozen]
    assert {v for _, v in power[0]["values"]} == {power[0]["values"][0][1]}


def test_idle_and_busy_devices_look_like_dcgm(demo: Path, expected: dict[str, dict[str, Any]]) -> None:
    idle = _node_of(expected, "idle_window_clean")
    busy = next(
        n for n, e in sorted(expected.items()) if e["verdict"] == "busy" and n.startswith("ip-10-0-1")
    )
    util = _series(demo, "DCGM_FI_DEV_GPU_UTIL")
    idle_values = {int(v) for s in util if s["metric"]["node"] == idle for _, v in s["values"]}
    assert idle_values <= {0, 1, 2}
    busy_values = [int(v) for s in util if s["metric"]["node"] == busy for _, v in s["values"]]
    assert min(busy_values) >= 60
    assert max(busy_values) <= 99
    for series in _series(demo, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        assert all(0 <= float(v) <= 1 for _, v in series["values"])  # a ratio, not a percentage


def test_mig_node_reports_activity_only_in_prof_per_instance(demo: Path) -> None:
    prof = [s for s in _series(demo, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") if "GPU_I_ID" in s["metric"]]
    assert len(prof) == 32
    assert {s["metric"]["GPU_I_PROFILE"] for s in prof} == {"1g.5gb", "2g.10gb", "3g.20gb"}
    active = [s for s in prof if max(float(v) for _, v in s["values"]) > 0.5]
    assert [(s["metric"]["gpu"], s["metric"]["GPU_I_ID"]) for s in active] == [("0", "2")]
    mig_util = [s for s in _series(demo, "DCGM_FI_DEV_GPU_UTIL") if "GPU_I_ID" in s["metric"]]
    assert {v for s in mig_util for _, v in s["values"]} == {"0"}  # BUG-02


def test_one_node_misses_two_of_four_gpus(demo: Path, expected: dict[str, dict[str, Any]]) -> None:
    node = _node_of(expected, "no_series")
    gpus = {s["metric"]["gpu"] for s in _series(demo, "DCGM_FI_DEV_GPU_UTIL") if s["metric"]["node"] == node}
    assert gpus == {"0", "1"}


def test_node_groups_and_instances(demo: Path, expected: dict[str, dict[str, Any]]) -> None:
    groups = _load(demo, "nodegroups.json")
    for asg in groups["autoScalingGroups"]:
        assert asg["DesiredCapacity"] == len(asg["Instances"])
        assert asg["MinSize"] <= asg["DesiredCapacity"] <= asg["MaxSize"]
        assert {i["LifecycleState"] for i in asg["Instances"]} == {"InService"}
    asg_names = {ng["resources"]["autoScalingGroups"][0]["name"] for ng in groups["nodegroups"]}
    assert asg_names == {asg["AutoScalingGroupName"] for asg in groups["autoScalingGroups"]}
    in_asg = {i["InstanceId"] for i in groups["autoScalingInstances"]}
    instances = [i for r in _load(demo, "instances.json")["Reservations"] for i in r["Instances"]]
    resizable = [i for i in instances if {"Key": "rightsizer.io/resize", "Value": "allowed"} in i["Tags"]]
    assert len(resizable) == 1
    assert resizable[0]["InstanceId"] not in in_asg  # standalone: known, and in no Auto Scaling group


def test_expected_verdicts_use_design_codes(expected: dict[str, dict[str, Any]]) -> None:
    assert len(expected) == 14
    for entry in expected.values():
        reasons = entry["reasons_include"]
        assert entry["verdict"] in VERDICTS
        assert set(reasons) <= set(REASON_CODES)
        assert reasons == order_reasons(reasons)  # docs/architecture.md §3: in the order of the code list
        # The listed codes alone already decide the class (they are the reasons that make the verdict).
        assert verdict_of(reasons, cheaper_shape_fits=entry["verdict"] == "underutilized") == entry["verdict"]
    verdicts = Counter(e["verdict"] for e in expected.values())
    assert verdicts == {"protected": 7, "busy": 2, "underutilized": 2, "unknown": 2, "idle": 1}


def test_dev_group_is_two_idle_g5_xlarge_nodes_for_off_hours(demo: Path) -> None:
    # The off-hours part of `rightsizer demo` scales gpu-dev to zero and back: it needs a group whose min
    # is 0, with idle nodes running nothing but DaemonSets.
    groups = _load(demo, "nodegroups.json")
    dev = next(ng for ng in groups["nodegroups"] if ng["nodegroupName"] == "gpu-dev")
    assert dev["scalingConfig"] == {"minSize": 0, "desiredSize": 2, "maxSize": 2}
    assert dev["instanceTypes"] == ["g5.xlarge"]
    nodes = [
        n
        for n in _load(demo, "nodes.json")["items"]
        if n["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") == "gpu-dev"
    ]
    assert len(nodes) == 2
    assert len({n["status"]["addresses"][0]["address"] for n in nodes}) == 2
    names = {n["metadata"]["name"] for n in nodes}
    on_dev = [p for p in _load(demo, "pods.json")["items"] if p["spec"]["nodeName"] in names]
    assert on_dev
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in on_dev} == {"DaemonSet"}
    uuids = {
        s["metric"]["UUID"] for s in _series(demo, "DCGM_FI_DEV_GPU_UTIL") if s["metric"]["node"] in names
    }
    assert len(uuids) == 2
    util = {
        v
        for s in _series(demo, "DCGM_FI_DEV_GPU_UTIL")
        if s["metric"]["node"] in names
        for _, v in s["values"]
    }
    assert util <= {"0", "1", "2"}


# --- scale -------------------------------------------------------------------------------------------------


def test_scale_has_eight_devices_per_node_per_metric(scale: Path) -> None:
    assert len(_load(scale, "nodes.json")["items"]) == 100
    for metric in DCGM_METRICS:
        devices = {(s["metric"]["node"], s["metric"]["UUID"]) for s in _series(scale, metric)}
        assert len(devices) == 800, metric
    assert len(_series(scale, "up")) == 100


def test_scale_node_groups_hold_at_most_fifty(scale: Path) -> None:
    sizes = [len(asg["Instances"]) for asg in _load(scale, "nodegroups.json")["autoScalingGroups"]]
    assert sizes == [50, 50]


def test_scale_mix_is_mostly_idle(scale: Path) -> None:
    verdicts = Counter(e["verdict"] for e in _load(scale, "expected.json").values())
    idle_by_metrics = verdicts["idle"] + verdicts["protected"]
    assert 55 <= idle_by_metrics <= 85
    assert verdicts["idle"] == 1  # one disruption-budget slot per run by default
    assert verdicts["busy"] > 0
    assert verdicts["unknown"] > 0


# --- inputs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scenario": "huge"}, "scenario"),
        ({"nodes": 5}, "exactly"),
        ({"scenario": "scale", "nodes": 0}, "nodes"),
        ({"taken_at": datetime(2026, 11, 2, 10, 0)}, "timezone"),  # noqa: DTZ001 - the naive value is the point
        ({"step_seconds": 7}, "divide"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_snapshot(tmp_path / "x", **kwargs)


def test_other_window_and_step(tmp_path: Path) -> None:
    at = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    out = generate_snapshot(tmp_path / "w", taken_at=at, window_seconds=600, step_seconds=30)
    series = _series(out, "DCGM_FI_DEV_GPU_UTIL")[0]
    assert len(series["values"]) == 600 // 30 + 1
    assert series["values"][-1][0] == at.timestamp()


def test_cli_writes_a_snapshot(tmp_path: Path) -> None:
    assert examplegen.main(["--out", str(tmp_path / "cli"), "--scenario", "scale", "--nodes", "3"]) == 0
    assert len(_load(tmp_path / "cli", "nodes.json")["items"]) == 3
    assert examplegen.main(["--out", str(tmp_path / "bad"), "--nodes", "3"]) == 2


# --- the scenario file drives the cast ------------------------------------------------------------------------


def test_a_scenario_file_is_the_whole_cast(tmp_path: Path) -> None:
    import random

    from tests.support.examplegen.cast import Ids
    from tests.support.examplegen.scenarios import build_from_file
    from tests.support.examplegen.sources import load_sources

    scenario = tmp_path / "two.yaml"
    scenario.write_text(
        """
title: two
power_decimals: 1
nfd_labels: false
groups: [{name: g, itype: g5.12xlarge, min: 0, max: 4}]
nodes:
  - id: first
    type: g5.12xlarge
    owner: mng
    group: g
    age_days: 3
    gpus: {model: a10g, count: 4}
    verdict: busy
    reasons: [activity_above_threshold]
    workloads:
      - namespace: ml
        app: trainer
        owner_kind: ReplicaSet
        container: main
        image: python:3.12-slim
        requests: {cpu: "1", memory: 1Gi}
        gpu_resource: nvidia.com/gpu
        gpus: 1
        started_ago: {hours: 2}
        load: {devices: [1], busy: true, activity_pct: 50.0, fb_used_mib: 100}
  - type: g5.12xlarge
    owner: mng
    group: g
    age_days: 1
    gpus: {model: a10g, count: 4}
    exporter_state: frozen
    verdict: unknown
    reasons: [exporter_frozen]
    why: "younger than {first}"
notes: ["{first} is busy"]
""",
        encoding="utf-8",
    )
    built = build_from_file(scenario, load_sources(), Ids(random.Random(1)), DEFAULT_TAKEN_AT)

    first, second = built.nodes
    assert (built.title, built.power_decimals, built.nfd_labels) == ("two", 1, False)
    assert [g["name"] for g in built.groups] == ["g"]
    assert (first.verdict, first.reasons, second.exporter_state) == (
        "busy",
        ("activity_above_threshold",),
        "frozen",
    )
    assert second.why == f"younger than {first.name}" and built.notes == [f"{first.name} is busy"]
    assert second.created - first.created > timedelta(
        hours=18
    )  # 3 days vs 1 day old, minus up to 6 h of jitter
    [trainer] = first.workloads
    assert trainer in built.pods and trainer["metadata"]["namespace"] == "ml"
    assert [d.load.busy for d in first.devices] == [False, True, False, False]
    assert first.devices[1].load.workload == ("ml", trainer["metadata"]["name"], "main")
