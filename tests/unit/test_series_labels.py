"""The series labels a snapshot keeps are the labels the decision reads, both ways (issue 14 item 3).

``series_label_keys`` is what ``rightsizer snapshot`` keeps of every series of ``metrics/*.json`` and what
``ObservationReducer`` reads (the live plan and ``plan --snapshot`` alike). The readers of series labels —
the format-2 reducer, the format-1 ``collect_signals`` and the backtest's ``gpu_activity`` — run here over
label maps that record every key looked up, with the reducer's own label filter switched off: a key looked
up that the allowlist lacks would be dropped from snapshots (fails), an allowlisted key nobody looks up
would leave the cluster for nothing (fails).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from rightsizer.adapters.snapshot_dir import _parse_matrix
from rightsizer.adapters.snapshot_projection import project_answer, project_documents
from rightsizer.domain import observation_signals
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import MetricData, Node, Pod, Series
from rightsizer.domain.observation_signals import ObservationReducer, series_label_keys
from rightsizer.domain.usage import (
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    POWER,
    PROF_ACTIVE,
    UP,
    CollectedSignals,
    Window,
    collect_signals,
    gpu_activity,
)
from tests.builders import AT, gpu_node, pod
from tests.support.recording import RecordingMap

WINDOW = Window(end=AT.timestamp(), seconds=1800, step=60)
GRID = [WINDOW.end - 60 * k for k in range(29, -1, -1)]
NODE_LABEL = "exported_node_name"
#: Labels exporters add that nothing reads (dcgm-exporter, kube-prometheus relabelling, pod labels).
UNREAD = {
    "modelName": "NVIDIA A10G",
    "pci_bus_id": "00000000:00:1E.0",
    "DCGM_FI_DRIVER_VERSION": "550.54.15",
    "container": "trainer",
    "label_ci_token": "SECRET-series-label-k3y7x9",
    "endpoint": "metrics",
}


def _cluster() -> tuple[list[Node], list[Pod]]:
    nodes = [Node.model_validate(gpu_node(f"gpu-{n}", gpus=2, ip=f"10.0.{n}.10")) for n in range(3)]
    pods = [Pod.model_validate(pod("trainer-0", "gpu-2", namespace="ml", gpus=1))]
    return nodes, pods


def _series() -> list[tuple[str, str, dict[str, str], list[float], list[float]]]:
    """Every way a series names its node and device: each node-name label (the configured one too), a pod
    (plain and ``exported_``), the exporter's address only; a GPU without ``UUID``; a MIG instance; an
    exporter known only by ``Hostname``; an unjoinable series. Each carries the ``UNREAD`` labels too."""
    ways: list[dict[str, str]] = [
        {NODE_LABEL: "gpu-0", "UUID": "GPU-0-0", "gpu": "0", "instance": "10.0.0.10:9400"},
        {"node": "gpu-0", "gpu": "1", "instance": "10.0.0.10:9400"},  # no UUID: the index names it
        {"kubernetes_node": "gpu-1", "UUID": "GPU-1-0", "Hostname": "gpu-1"},  # no instance
        {"hostname": "gpu-1", "UUID": "GPU-1-1", "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.5gb"},
        {"namespace": "ml", "pod": "trainer-0", "UUID": "GPU-2-0", "Hostname": "dcgm-exporter-x"},
        {"exported_namespace": "ml", "exported_pod": "trainer-0", "UUID": "GPU-2-1"},
        {"instance": "10.0.2.10:9400", "UUID": "GPU-2-1", "gpu": "1"},
        {"Hostname": "localhost", "UUID": "GPU-ghost"},  # joins nothing: unmapped
    ]
    fed: list[tuple[str, str, dict[str, str], list[float], list[float]]] = []
    for way in ways:
        labels = {**way, **UNREAD, "job": "dcgm"}
        fed.append(("step", GPU_UTIL, labels, GRID, [0.0] * 30))
        fed.append(("step", PROF_ACTIVE, labels, GRID, [0.001] * 30))
        fed.append(("step", FB_USED, labels, [WINDOW.end], [300.0]))
        fed.append(("step", POWER, labels, [WINDOW.end], [25.0]))
        fed.append(("stddev", POWER, labels, [WINDOW.end], [1.0]))
        fed.append(("stddev", ENERGY, labels, [WINDOW.end], [5.0]))
        fed.append(("avg", FB_USED, labels, [WINDOW.end], [300.0]))
        fed.append(("avg", FB_FREE, labels, [WINDOW.end], [22000.0]))
        fed.append(("timestamp", GPU_UTIL, labels, [WINDOW.end], [WINDOW.end - 5]))
        fed.append(("nonfinite", PROF_ACTIVE, labels, [WINDOW.end], [math.nan]))
    for n in range(3):
        target = {"instance": f"10.0.{n}.10:9400", "job": "dcgm"}
        fed.append(("step", UP, {**target, **UNREAD}, GRID, [1.0] * 30))
        fed.append(("count", UP, {**target, **UNREAD}, [WINDOW.end], [120.0]))  # scrapes every 15 s
    return fed


def _reduce(fed: list[tuple[str, str, Mapping[str, str], list[float], list[float]]]) -> CollectedSignals:
    nodes, pods = _cluster()
    reducer = ObservationReducer(NodeJoiner(nodes, pods, NODE_LABEL), WINDOW, 10.0)
    for kind, metric, labels, times, values in fed:
        reducer.add(kind, metric, labels, times, values)
        reducer.answered(kind, metric)
    return reducer.finish()


def _format1(
    fed: list[tuple[str, str, Mapping[str, str], list[float], list[float]]],
) -> dict[str, MetricData]:
    series: dict[str, list[Series]] = {}
    for kind, metric, labels, times, values in fed:
        if kind == "step":
            series.setdefault(metric, []).append(Series(labels, tuple(times), tuple(values)))  # type: ignore[arg-type]
    return {m: MetricData(m, tuple(s)) for m, s in series.items()}


@pytest.fixture(scope="module")
def reads() -> set[str]:
    """Every series label key the readers look up, with the reducer reading every label it is given."""
    log: set[str] = set()
    fed = [(k, m, RecordingMap(labels, log), t, v) for k, m, labels, t, v in _series()]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(observation_signals, "read_labels", lambda labels, keep: labels)
        signals = _reduce(fed)
    nodes, pods = _cluster()
    joiner = NodeJoiner(nodes, pods, NODE_LABEL)
    format1 = _format1(fed)
    timestamps = {GPU_UTIL: MetricData(GPU_UTIL, tuple(format1[GPU_UTIL].series))}
    collect_signals(format1, timestamps, joiner, WINDOW, 10.0)
    gpu_activity(format1, joiner, WINDOW)
    # the scenarios reach what they are meant to: every node, a MIG profile, an index-named GPU, unmapped
    assert set(signals.devices) == {"gpu-0", "gpu-1", "gpu-2"}
    assert any(d.mig_profile == "1g.5gb" for d in signals.devices["gpu-1"])
    assert any(d.device == "1" for d in signals.devices["gpu-0"])
    assert signals.unmapped
    assert any(d.sample_interval_s == 15.0 for d in signals.devices["gpu-0"])  # its target's up count
    return log


def test_every_label_the_readers_look_up_is_kept(reads: set[str]) -> None:
    assert sorted(reads - series_label_keys(NODE_LABEL)) == []


def test_every_kept_label_is_looked_up(reads: set[str]) -> None:
    assert sorted(series_label_keys(NODE_LABEL) - reads) == []


def test_the_configured_node_label_is_kept_only_when_configured() -> None:
    assert NODE_LABEL in series_label_keys(NODE_LABEL)
    assert NODE_LABEL not in series_label_keys(None)
    assert series_label_keys(None) < series_label_keys(NODE_LABEL)


def test_the_reducer_reads_only_kept_labels_and_decides_as_on_the_kept_labels_alone() -> None:
    # GIVEN the same answers with every label, and with the kept labels only
    keep = series_label_keys(NODE_LABEL)
    fed = _series()
    kept = [(k, m, {n: v for n, v in labels.items() if n in keep}, t, vs) for k, m, labels, t, vs in fed]

    # WHEN both are reduced
    full, projected = _reduce(fed), _reduce(kept)

    # THEN the signals are the same, and what the plan reports of unmapped series holds no unread label
    assert full == projected
    assert full.unmapped and all(set(u.labels) <= keep for u in full.unmapped)
    assert "SECRET-series-label-k3y7x9" not in repr(full)


def _answer(result: Any, **extra: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}, **extra}


def test_a_projected_answer_decodes_to_the_kept_labels_and_the_same_samples() -> None:
    keep = series_label_keys("node")
    labels = {"node": "gpu-0", "UUID": "GPU-1", "__name__": "DCGM_FI_DEV_GPU_UTIL", **UNREAD}
    answer = _answer([{"metric": labels, "values": [[1.0, "3"], [61.0, "NaN"]], "histograms": []}])
    answer["infos"] = ["PromQL info: x"]
    projected = project_answer(answer, keep)
    (series,) = _parse_matrix("m", projected).series
    assert series.labels == {"node": "gpu-0", "UUID": "GPU-1"}
    assert series.values[0] == 3.0 and math.isnan(series.values[1])
    assert projected == _answer(
        [{"metric": {"node": "gpu-0", "UUID": "GPU-1"}, "values": answer["data"]["result"][0]["values"]}]
    )


@pytest.mark.parametrize(
    "answer",
    [
        None,
        ["not", "an", "object"],
        {"status": "error", "errorType": "timeout", "error": "SECRET-series-label-k3y7x9"},
        _answer([], warnings=["PromQL warning"]),
        {"status": "success", "data": {"resultType": "vector", "result": []}},
        {"status": "success", "data": ["SECRET-series-label-k3y7x9"]},
        {"status": "success"},
        _answer("SECRET-series-label-k3y7x9"),
        _answer(["SECRET-series-label-k3y7x9"]),
        _answer([{"metric": "SECRET-series-label-k3y7x9", "values": []}]),
        _answer([{"metric": None, "values": []}]),
        _answer([{"metric": {"node": "a"}, "values": [[1.0]]}]),
    ],
)
def test_an_unusable_answer_stays_unusable_for_the_same_reason_and_leaks_nothing(answer: Any) -> None:
    projected = project_answer(answer, series_label_keys(None))
    assert _parse_matrix("m", projected).problem == _parse_matrix("m", answer).problem
    assert "SECRET" not in repr(projected)


def test_snapshot_documents_keep_the_labels_of_the_recorded_node_label() -> None:
    series = {"metric": {"my_node": "gpu-0", "UUID": "GPU-1", **UNREAD}, "values": [[1.0, "0"]]}
    docs = {
        "snapshot.json": {"node_label": "my_node"},
        "metrics/DCGM_FI_DEV_GPU_UTIL.json": _answer([series]),
    }
    projected = project_documents(docs)
    (kept,) = projected["metrics/DCGM_FI_DEV_GPU_UTIL.json"]["data"]["result"]
    assert kept["metric"] == {"my_node": "gpu-0", "UUID": "GPU-1"}
    assert projected["snapshot.json"] == docs["snapshot.json"]
