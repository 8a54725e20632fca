"""``ObservationReducer``: answers fed in any order and any split reduce to the same per-device facts.

The live path hands the reducer sub-window and shard answers as they arrive (4 in flight), so arrival
order differs between runs; a snapshot feeds whole files. The facts, and the labels that speak for a
device, must not depend on either. The per-step reduction has a bulk path (every point on the step
grid, all finite) and a point-by-point path; both must agree.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from rightsizer.adapters.prometheus_matrix import MatrixFeeder, decode
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import Node
from rightsizer.domain.observation import ObservationReducer
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
)
from tests.builders import AT, gpu_node

WINDOW = Window(end=AT.timestamp(), seconds=1800, step=60)
GRID = [WINDOW.end - 60 * k for k in range(29, -1, -1)]
Fed = tuple[str, str, dict[str, str], list[float], list[float]]


def answers(rng: random.Random) -> list[Fed]:
    """Series of 3 nodes × 2 GPUs: pod-label variants, NaN/±Inf, gaps, a MIG instance, an unjoinable one."""
    fed: list[Fed] = []
    for n in range(3):
        node = f"gpu-{n}"
        fed.append(("step", UP, {"instance": f"10.1.{n}.1:9400", "node": node}, GRID, [1.0] * 30))
        for g in range(2):
            base = {"UUID": f"GPU-{n}-{g}", "gpu": str(g), "instance": f"10.1.{n}.1:9400", "node": node}
            for pod in ("a", "b") if rng.random() < 0.5 else ("a",):
                # a variant may come through another exporter pod: which one speaks must not depend on order
                labels = {**base, "namespace": "ml", "pod": pod, "instance": f"10.1.{n}.{ord(pod)}:9400"}
                times = [t for t in GRID if rng.random() < 0.8]
                values = [rng.choice([0.0, 3.0, 80.0]) for _ in times]
                if values and rng.random() < 0.3:
                    values[rng.randrange(len(values))] = rng.choice([math.nan, math.inf])
                fed.append(("step", GPU_UTIL, labels, times, values))
                fed.append(("step", PROF_ACTIVE, labels, times, [v / 100 for v in values]))
                fed.append(("step", FB_USED, labels, [WINDOW.end], [rng.choice([300.0, 9000.0, math.inf])]))
                fed.append(("step", POWER, labels, [WINDOW.end], [rng.uniform(20, 200)]))
                fed.append(("stddev", POWER, labels, [WINDOW.end], [rng.choice([0.0, 2.0, math.nan])]))
                fed.append(("stddev", ENERGY, labels, [WINDOW.end], [rng.choice([0.0, 5.0])]))
                fed.append(("avg", FB_USED, labels, [WINDOW.end], [300.0]))
                fed.append(("avg", FB_FREE, labels, [WINDOW.end], [22728.0]))
                fed.append(("timestamp", GPU_UTIL, labels, [WINDOW.end], [WINDOW.end - rng.uniform(0, 30)]))
            mig = {**base, "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.5gb"}
            fed.append(("step", PROF_ACTIVE, mig, GRID, [0.5] * 30))
    fed.append(("step", GPU_UTIL, {"UUID": "GPU-ghost", "node": "elsewhere"}, GRID, [0.0] * 30))
    return fed


def reduce(fed: list[Fed], split: bool = False) -> CollectedSignals:
    nodes = [Node.model_validate(gpu_node(f"gpu-{n}", gpus=2)) for n in range(3)]
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    for kind, metric, labels, times, values in fed:
        if split and len(times) > 1:  # as sub-window answers: two halves, second first
            half = len(times) // 2
            reducer.add(kind, metric, labels, times[half:], values[half:])
            reducer.add(kind, metric, labels, times[:half], values[:half])
        else:
            reducer.add(kind, metric, labels, times, values)
    for kind, metric in {(f[0], f[1]) for f in fed}:
        reducer.answered(kind, metric)
    return reducer.finish()


@pytest.mark.parametrize("seed", range(8))
def test_arrival_order_and_splits_do_not_change_the_facts(seed: int) -> None:
    fed = answers(random.Random(seed))
    expected = reduce(fed)
    shuffled = list(fed)
    random.Random(seed + 100).shuffle(shuffled)
    assert reduce(shuffled) == expected
    assert reduce(list(reversed(fed)), split=True) == expected
    # AND the case is not vacuous: devices, MIG, unmapped and non-finite findings are there
    signals = reduce(fed)
    assert sum(len(d) for d in signals.devices.values()) == 3 * 2 * 2  # 2 GPUs + 2 MIG instances per node
    assert signals.unmapped and signals.up_coverage == {f"gpu-{n}": 1.0 for n in range(3)}


def test_points_off_the_step_grid_reduce_like_points_on_it() -> None:
    # GIVEN the same samples once on the step grid and once 1 ms before each step point
    on = answers(random.Random(1))
    off = [
        (k, m, lab, [t - 0.001 for t in ts] if k == "step" and len(ts) > 1 else ts, vs)
        for k, m, lab, ts, vs in on
    ]
    # THEN the point-by-point path (off the grid) and the bulk path agree
    assert reduce(off) == reduce(on)


def test_a_nan_among_finite_points_is_found_whatever_the_path() -> None:
    nodes = [Node.model_validate(gpu_node("gpu-0", gpus=1))]
    labels = {"UUID": "GPU-0", "gpu": "0", "node": "gpu-0"}
    for times in (GRID, [t - 0.5 for t in GRID]):
        reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
        reducer.add("step", GPU_UTIL, labels, times, [0.0] * 14 + [math.nan] + [90.0] * 15)
        reducer.answered("step", GPU_UTIL)
        [device] = reducer.finish().devices["gpu-0"]
        assert device.non_finite == (GPU_UTIL,)
        assert device.activity_max_pct == 90.0 and device.activity_points == 29
    with pytest.raises(ValueError, match="times for"):
        reducer.add("step", GPU_UTIL, labels, GRID, [0.0])


def _prometheus_value(v: float) -> str:
    # the API's float format: NaN, +Inf, -Inf, else the number
    return "NaN" if v != v else "+Inf" if v == math.inf else "-Inf" if v == -math.inf else repr(v)


def _answer(series: list[Fed]) -> bytes:
    result = [
        {"metric": labels, "values": [[t, _prometheus_value(v)] for t, v in zip(times, values, strict=True)]}
        for _, _, labels, times, values in series
    ]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


@pytest.mark.parametrize("seed", range(8))
def test_whole_answers_fed_from_json_reduce_like_series_fed_one_by_one(seed: int) -> None:
    # GIVEN the series of a fleet as the live path receives them: one JSON answer per (kind, metric),
    # in two parts (sub-windows / shards), label sets met again in several answers, ±Inf and NaN as text
    fed = answers(random.Random(seed))
    nodes = [Node.model_validate(gpu_node(f"gpu-{n}", gpus=2)) for n in range(3)]
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    feeder = MatrixFeeder(reducer)
    groups: dict[tuple[str, str], list[Fed]] = {}
    for f in fed:
        groups.setdefault((f[0], f[1]), []).append(f)
    for (kind, metric), series in groups.items():
        half = len(series) // 2
        for part in (series[half:], series[:half]):
            feeder.feed(kind, metric, decode(_answer(part)))
        reducer.answered(kind, metric)
    # THEN the facts are those of the series fed one by one (the snapshot path)
    assert reducer.finish() == reduce(fed)


def test_a_malformed_label_set_feeds_the_series_before_it_and_raises() -> None:
    nodes = [Node.model_validate(gpu_node("gpu-0", gpus=1))]
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    good = {"metric": {"UUID": "GPU-0", "gpu": "0", "node": "gpu-0"}, "values": [[GRID[-1], "300"]]}
    body = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [good, {"metric": ["x"], "values": []}]},
    }
    with pytest.raises(ValueError, match="not an object"):
        MatrixFeeder(reducer).feed("step", FB_USED, decode(json.dumps(body).encode()))
    reducer.add("step", GPU_UTIL, good["metric"], GRID, [0.0] * 30)  # type: ignore[arg-type]
    reducer.answered("step", GPU_UTIL)
    [device] = reducer.finish().devices["gpu-0"]
    assert device.fb_used_max_mib == 300.0


@pytest.mark.parametrize("up_kinds", [("step", "count"), ("count",), ("count", "step")])
def test_a_failed_device_shard_names_no_node_through_any_up_answer(up_kinds: tuple[str, ...]) -> None:
    """``up`` is never sharded and carries no ``gpu``, so neither its per-step answer nor its scrape
    count (``up.count``) may make the ``rest`` shard, which holds every series without ``gpu``, name
    their nodes when it fails; only nodes with a DCGM series of the shard's indices are named. Holds
    whatever the order, and when the per-step ``up`` answer failed and only the count arrived."""
    from rightsizer.domain.observation import device_shards

    nodes = [Node.model_validate(gpu_node(f"gpu-{n}", instance_type="g5.xlarge", gpus=1)) for n in range(2)]
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    for n in range(2):
        target = {"job": "dcgm", "instance": f"10.1.{n}.1:9400", "node": f"gpu-{n}"}
        for kind in up_kinds:
            reducer.add(
                kind, UP, target, *((GRID, [1.0] * 30) if kind == "step" else ([WINDOW.end], [120.0]))
            )
        # single-GPU nodes: every DCGM series has gpu="0", the first shard's index
        reducer.add("step", GPU_UTIL, {**target, "UUID": f"GPU-{n}", "gpu": "0"}, GRID, [0.0] * 30)
    first, *_, rest = device_shards(2)
    assert reducer.nodes_of_series(rest.label, rest.holds) == set()
    assert reducer.nodes_of_series(first.label, first.holds) == {"gpu-0", "gpu-1"}


def test_label_sets_are_kept_once_each_pair_shared_between_them() -> None:
    """80,000 devices at 10,000 nodes: a label set is kept as its (name, value) pairs, each pair stored
    once for the whole collection (a node's name, address and job recur in all its GPUs' label sets),
    without a dict, and sorted only when it did not come sorted; what it reads stays the same."""
    nodes = [Node.model_validate(gpu_node("gpu-0", gpus=2))]
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    common = {"job": "dcgm", "instance": "10.1.0.1:9400", "node": "gpu-0"}
    first = reducer.resolve({"UUID": "GPU-0", "gpu": "0", **common, "modelName": "NVIDIA A10G"})
    second = reducer.resolve(
        {"UUID": "GPU-1", "gpu": "1", **{k: "".join(list(v)) for k, v in common.items()}}
    )
    shared = [p for p in second.ident if p[0] in common]
    assert len(shared) == 3 and all(any(p is q for q in first.ident) for p in shared)
    assert first.labels == {"UUID": "GPU-0", "gpu": "0", **common}  # modelName is not read
    assert first.label("instance") == "10.1.0.1:9400" and first.label("GPU_I_ID") == ""
    assert first.device == ("gpu-0", "GPU-0", "") and first.target == ("dcgm", "10.1.0.1:9400")
    assert first.target is second.target
    assert first.sorted_ident == tuple(sorted(first.ident)) != first.ident
    ordered = reducer.resolve(dict(sorted({"UUID": "GPU-1", "gpu": "1", **common}.items())))
    assert ordered.sorted_ident is ordered.ident
    assert reducer.resolve({"UUID": "GPU-0", "gpu": "0", **common}) is first  # found again, not rebuilt


def test_the_memory_of_a_device_is_the_largest_total_of_its_series() -> None:
    # GIVEN one GPU seen through two exporter pods (two label sets), used/free averages in any order
    nodes = [Node.model_validate(gpu_node("gpu-0", gpus=1))]
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    base = {"UUID": "GPU-0", "gpu": "0", "node": "gpu-0"}
    a, b = {**base, "pod": "a", "namespace": "ml"}, {**base, "pod": "b", "namespace": "ml"}
    reducer.add("step", GPU_UTIL, a, GRID, [0.0] * 30)
    reducer.add("step", FB_USED, a, [WINDOW.end], [500.0])
    reducer.add("avg", FB_FREE, b, [WINDOW.end], [23000.0])
    reducer.add("avg", FB_USED, a, [WINDOW.end], [300.0])
    reducer.add("avg", FB_FREE, a, [WINDOW.end], [22000.0])
    reducer.add("avg", FB_USED, b, [WINDOW.end], [400.0])
    reducer.add("timestamp", GPU_UTIL, a, [WINDOW.end], [WINDOW.end - 20])
    reducer.add("timestamp", GPU_UTIL, b, [WINDOW.end], [WINDOW.end - 5])
    for kind, metric in (("step", GPU_UTIL), ("step", FB_USED), ("avg", FB_USED), ("avg", FB_FREE)):
        reducer.answered(kind, metric)
    [device] = reducer.finish().devices["gpu-0"]
    # THEN the larger series total counts (23,400 MiB), and the newest sample of either series
    assert device.fb_total_mib == 23400.0 and device.newest_sample == WINDOW.end - 5
    # AND a series with only one side has no total
    reducer = ObservationReducer(NodeJoiner(nodes, [], "node"), WINDOW, 10.0)
    reducer.add("step", FB_USED, a, [WINDOW.end], [500.0])
    reducer.add("avg", FB_USED, a, [WINDOW.end], [300.0])
    reducer.add("avg", FB_FREE, b, [WINDOW.end], [23000.0])
    reducer.add("step", GPU_UTIL, a, GRID, [0.0] * 30)
    [device] = reducer.finish().devices["gpu-0"]
    assert device.fb_total_mib is None
