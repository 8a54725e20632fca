"""Metrics format 2 (``rightsizer.domain.observation``): snapshot files in, verdict facts out; old snapshots.

Pure: snapshot directories written to ``tmp_path`` and decoded by the real loader, no server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.domain.errors import SnapshotError
from rightsizer.domain.observation import file_kind, observation_queries
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import ENERGY, FB_FREE, FB_USED, GPU_UTIL, POWER, UP
from tests.builders import AT, STEP, WINDOW, gpu_node, rfc, verdict_reasons

END = AT.timestamp()
NODE = "gpu-a"
DEV = {"node": NODE, "gpu": "0", "UUID": "GPU-a-0", "instance": "10.1.0.1:9400"}


def matrix(points: list[tuple[float, str]], labels: dict[str, str] = DEV) -> dict[str, Any]:
    result = [{"metric": labels, "values": [[t, v] for t, v in points]}]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def steps(value: str) -> list[tuple[float, str]]:
    return [(END - STEP * k, value) for k in range(WINDOW // STEP - 1, -1, -1)]


def write(root: Path, files: dict[str, dict[str, Any]], *, metrics_format: int | None = 2) -> Path:
    meta: dict[str, Any] = {
        "taken_at": rfc(AT),
        "window_seconds": WINDOW,
        "step_seconds": STEP,
        "cluster": "c",
        "region": "us-east-1",
    }
    if metrics_format is not None:
        meta["metrics_format"] = metrics_format
    node = gpu_node(NODE, instance_type="g5.2xlarge", gpus=1, ip="10.0.0.5")
    docs = {
        "snapshot.json": meta,
        "nodes.json": {"kind": "List", "items": [node]},
        "pods.json": {"kind": "List", "items": []},
        "pdbs.json": {"kind": "List", "items": []},
        **files,
    }
    for relative, doc in docs.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
    return root


def idle_files(**override: dict[str, Any]) -> dict[str, dict[str, Any]]:
    files = {
        f"metrics/{GPU_UTIL}.json": matrix(steps("1")),
        f"metrics/{UP}.json": matrix(steps("1"), {"instance": "10.1.0.1:9400"}),
        f"metrics/{FB_USED}.json": matrix([(END, "300")]),
        f"metrics/{POWER}.json": matrix([(END, "27")]),
        f"metrics/{POWER}.stddev.json": matrix([(END, "0.4")]),
        f"metrics/{ENERGY}.stddev.json": matrix([(END, "2.5e6")]),
        f"metrics/{FB_USED}.avg.json": matrix([(END, "300")]),
        f"metrics/{FB_FREE}.avg.json": matrix([(END, "22428")]),
        f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - 12))]),
    }
    files.update(override)
    return files


def decide(root: Path) -> Any:
    return plan(load_snapshot(root), Policy()).nodes[0]


def test_every_query_has_its_own_file_and_the_file_names_parse_back() -> None:
    paths = [q.path for q in observation_queries()]
    assert len(paths) == len(set(paths)) == 14
    for q in observation_queries():
        kind, metric = file_kind(q.path.removeprefix("metrics/").removesuffix(".json"))
        assert metric == q.metric
        assert kind == ("step" if q.kind == "max" else q.kind)


def test_a_format_2_snapshot_decides_on_its_files(tmp_path: Path) -> None:
    row = decide(write(tmp_path, idle_files()))
    # clean evidence: the only finding is the missing AWS inventory of this minimal snapshot
    assert verdict_reasons(row.reasons) == ["node_group_unknown:no_inventory"]
    assert row.coverage == 1.0
    assert row.fb_used_max_mib == 300.0


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({f"metrics/{ENERGY}.stddev.json": matrix([(END, "0")])}, "exporter_frozen"),
        ({f"metrics/{ENERGY}.stddev.json": matrix([(END, "NaN")])}, f"non_finite:{ENERGY}"),
        ({f"metrics/{FB_FREE}.avg.json": matrix([(END, "NaN")])}, f"non_finite:{FB_FREE}"),
        ({f"metrics/{GPU_UTIL}.nonfinite.json": matrix([(END, "NaN")])}, f"non_finite:{GPU_UTIL}"),
        ({f"metrics/{FB_USED}.json": matrix([(END, "+Inf")])}, f"non_finite:{FB_USED}"),
        ({f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - 900))])}, "stale_metrics:900s"),
        ({f"metrics/{GPU_UTIL}.json": matrix(steps("1")[:20])}, "coverage_below_min"),
        ({f"metrics/{GPU_UTIL}.json": {"status": "error", "errorType": "timeout"}}, "partial_response"),
        # impossible framebuffer readings: an exporter that lost the GPU reports zeros or nonsense
        (
            {
                f"metrics/{FB_USED}.avg.json": matrix([(END, "0")]),
                f"metrics/{FB_FREE}.avg.json": matrix([(END, "0")]),
            },
            "fb_implausible:used_plus_free_not_positive",
        ),
        ({f"metrics/{FB_USED}.json": matrix([(END, "-5")])}, "fb_implausible:negative_used"),
    ],
)
def test_evidence_problems_make_the_node_unknown(
    tmp_path: Path, override: dict[str, dict[str, Any]], reason: str
) -> None:
    row = decide(write(tmp_path, idle_files(**override)))
    assert row.verdict == "unknown", row.reasons
    assert any(r.startswith(reason) for r in row.reasons), row.reasons


def test_a_step_point_means_a_maximum_in_format_2_and_a_sample_in_format_1(tmp_path: Path) -> None:
    # GIVEN the same files, once marked format 2 and once without a format (a format-1 snapshot)
    files = idle_files()
    v2 = decide(write(tmp_path / "v2", files))
    v1 = decide(write(tmp_path / "v1", files, metrics_format=None))
    # THEN both read the activity points alike, and format 1 still reads its timestamp file
    assert v2.gpu_activity_max_pct == v1.gpu_activity_max_pct == 1.0
    assert not any(r.startswith("stale_metrics") for r in (*v1.reasons, *v2.reasons))
    # AND only format 2 reads the window files: format 1 finds no FB_FREE matrix and takes the one power
    # point for a frozen exporter
    assert f"partial_response:{FB_FREE}" in v1.reasons and any(
        r.startswith("exporter_frozen") for r in v1.reasons
    )
    assert verdict_reasons(v2.reasons) == ["node_group_unknown:no_inventory"]


def test_an_unknown_metrics_format_is_refused_with_its_field(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="metrics_format"):
        load_snapshot(write(tmp_path, idle_files(), metrics_format=3))


@pytest.mark.parametrize("count", [2, 3, 4, 10, 16, 40])
def test_device_shards_partition_every_gpu_index_exactly_and_evenly(count: int) -> None:
    """Every ``gpu`` label value — indices 0-31, other forms, none — is held by exactly one shard, by
    ``holds`` and by the matcher read as Prometheus reads it (anchored at both ends); each matcher is a
    set of literal values (Prometheus' index fast path, no regex over every label value); indices
    0-15 spread evenly over a power of two of shards, at most 16, so an n-GPU node puts one GPU in
    each of n shards."""
    import re

    from rightsizer.domain.observation import MAX_DEVICE_SHARDS, device_shards

    shards = device_shards(count)
    n = len(shards)
    assert n >= min(count, MAX_DEVICE_SHARDS) and n <= MAX_DEVICE_SHARDS and n & (n - 1) == 0
    indices = [str(i) for i in range(32)]
    values = [*indices, "", "00", "01", " 1", "1 ", "x", "gpu0", "-1", "1\n", "ü", "0|1", ".*"]

    def regex_holds(matcher: str, value: str) -> bool:
        _label, op, pattern = re.fullmatch(r'(gpu)(=~|!~)"(.*)"', matcher).groups()  # type: ignore[union-attr]
        assert re.fullmatch(r"\d+(\|\d+)*", pattern), pattern  # literal values only: findSetMatches
        found = re.fullmatch(pattern, value) is not None
        return found if op == "=~" else not found

    per_shard = [0] * n
    for value in values:
        held = [i for i, s in enumerate(shards) if s.holds(value)]
        assert len(held) == 1, (value, held)
        assert [i for i, s in enumerate(shards) if regex_holds(s.matcher(), value)] == held, value
        if value in indices[:MAX_DEVICE_SHARDS]:
            per_shard[held[0]] += 1
    assert per_shard == [MAX_DEVICE_SHARDS // n] * n  # even over the indices 0-15
    for gpus in (1, 2, 4, 8):  # a node's GPUs 0 … gpus-1 fall in min(gpus, n) shards, evenly
        held = [next(i for i, s in enumerate(shards) if s.holds(str(g))) for g in range(gpus)]
        assert sorted(set(held)) == list(range(min(gpus, n)))
    assert device_shards(1) == device_shards(0) == ()


class _ScopedPrometheus:
    """A metrics port for one node's read: its activity series name the targets ``named``; ``up`` counts
    come for the targets ``selected`` (those the node's matchers select) and, asked by name, for any."""

    def __init__(
        self, named: list[str], selected: list[str], fail_by_name: bool = False, fail_scoped: bool = False
    ) -> None:
        self.named, self.selected, self.asked = named, selected, []
        self.fail_by_name, self.fail_scoped = fail_by_name, fail_scoped

    def query_range_raw(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        self.asked.append(expr)
        if expr.startswith("max_over_time(DCGM_FI_DEV_GPU_UTIL"):
            metrics = [
                {"UUID": f"GPU-{i}", "gpu": "0", "instance": t, "job": "dcgm"}
                for i, t in enumerate(self.named)
            ]
        elif expr.startswith("count_over_time(up") and 'instance=~"' in expr and "node=" not in expr:
            if self.fail_by_name:
                return {"status": "error", "errorType": "timeout", "error": "query timed out"}
            metrics = [
                {"instance": t, "job": "dcgm"}
                for t in self.named
                if re.escape(t).replace("\\-", "-") in expr.replace("\\\\", "\\")
            ]
        elif expr.startswith("count_over_time(up"):
            if self.fail_scoped:
                return {"status": "error", "errorType": "timeout", "error": "query timed out"}
            metrics = [{"instance": t, "job": "dcgm"} for t in self.selected]
        else:
            metrics = []
        result = [{"metric": m, "values": [[end, "120"]]} for m in metrics]
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}


@pytest.mark.parametrize("fail_by_name", [False, True])
def test_one_nodes_snapshot_counts_the_up_of_targets_its_matchers_did_not_select(fail_by_name: bool) -> None:
    from rightsizer.services.snapshot import ObserveRequest, metric_documents

    # GIVEN a node whose two exporters' targets are named "10.1.0.5:9400" (its pod's IP, selected by the
    # node's matchers) and "gpu.dcgm.example:9400" (a name of the scrape config's own)
    port = _ScopedPrometheus(["10.1.0.5:9400", "gpu.dcgm.example:9400"], ["10.1.0.5:9400"], fail_by_name)
    request = ObserveRequest(
        at=AT, window_seconds=WINDOW, step_seconds=STEP, cluster="c", region="r", job="dcgm"
    )
    documents = metric_documents(port, request, ('node="n"', 'instance=~"10\\\\.1\\\\.0\\\\.5(:[0-9]+)?"'))
    # THEN the up of the other target is asked by its name, once, after the scoped queries
    by_name = [e for e in port.asked if e.startswith("count_over_time(up") and "node=" not in e]
    assert len(by_name) == 1 and port.asked[-1] == by_name[0]
    assert 'instance=~"gpu\\\\.dcgm\\\\.example:9400"' in by_name[0]
    counted = documents["metrics/up.count.json"]
    if fail_by_name:  # AND a failed answer makes the count a problem: never a looser freshness bound
        assert counted["status"] == "error"
    else:  # AND its count joins the selected one in up.count.json
        instances = sorted(s["metric"]["instance"] for s in counted["data"]["result"])
        assert instances == ["10.1.0.5:9400", "gpu.dcgm.example:9400"]


def test_a_failed_scoped_up_count_stays_failed_whatever_the_count_by_name_says() -> None:
    from rightsizer.services.snapshot import ObserveRequest, metric_documents

    # GIVEN a node's read whose scoped up count failed, while its other target's count by name would answer
    port = _ScopedPrometheus(["10.1.0.5:9400", "gpu.dcgm.example:9400"], ["10.1.0.5:9400"], fail_scoped=True)
    request = ObserveRequest(
        at=AT, window_seconds=WINDOW, step_seconds=STEP, cluster="c", region="r", job="dcgm"
    )
    documents = metric_documents(port, request, ('node="n"', 'instance=~"10\\\\.1\\\\.0\\\\.5(:[0-9]+)?"'))
    # THEN up.count.json keeps the failure (collect_live keeps the count a problem too): the selected
    # target's count is missing, so no answer by name may stand in for the whole file
    assert documents["metrics/up.count.json"]["status"] == "error"
