"""The window includes the sample at its first instant, as a range selector does (issue 33).

GIVEN scrapes on the step grid (phase 0, every 15 s), so one raw sample sits exactly at the window's
first instant (end − W), and on each node that sample alone carries the fact under test,
WHEN the live path (``collect_live``) and the snapshot path (the files ``rightsizer snapshot`` records,
read as ``plan --snapshot`` reads them) read a real Prometheus 2.x,
THEN every kind of fact counts it: activity of either family (and its step), framebuffer and power
maxima, the spread (a counter that moved only there), the average (a non-finite sample only there),
the non-finite sum and the scrape count.

Before: ``[W − 1ms]`` and ``[step − 1ms]`` ranges dropped that sample (at 10,000 nodes 13 hosts' maximum
activity and 68 hosts' maximum framebuffer read wrong for exactly that reason).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from rightsizer.adapters.prometheus import PrometheusClient, collect_live
from rightsizer.adapters.snapshot_dir import _parse_matrix
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.observation import file_kind, observation_queries
from rightsizer.domain.observation_signals import signals_from_observation
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import (
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    POWER,
    PROF_ACTIVE,
    UP,
    CollectedSignals,
    DeviceSignals,
    Window,
)
from tests.builders import AT, WINDOW, gpu_node, snapshot

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

END = AT.timestamp()
FIRST = END - WINDOW
STEP = 60
#: Scrapes on the grid, 10 minutes before the window to its end: one exactly at FIRST.
TIMES = [END - WINDOW - 600 + 15.0 * k for k in range((WINDOW + 600) // 15 + 1)]
BASE = {GPU_UTIL: 0.0, PROF_ACTIVE: 0.0, FB_USED: 300.0, FB_FREE: 22728.0, POWER: 27.0}

#: node → (metric, value of the sample at FIRST only); the rest of the node's samples are BASE.
CASES: dict[str, tuple[str, float]] = {
    "activity-util": (GPU_UTIL, 90.0),
    "activity-prof": (PROF_ACTIVE, 0.9),
    "framebuffer": (FB_USED, 15000.0),
    "power": (POWER, 300.0),
    "stddev": (ENERGY, 7.6e10),
    "avg": (FB_FREE, math.nan),
    "nonfinite": (GPU_UTIL, math.nan),
    "control": (GPU_UTIL, 0.0),
}


def _families() -> dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]]:
    families: dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]] = {}
    for i, (name, (metric, special)) in enumerate(CASES.items()):
        labels = {
            "gpu": "0",
            "UUID": f"GPU-{name}",
            "instance": f"10.9.0.{i}:9400",
            "job": "dcgm",
            "node": name,
        }
        for m in (*BASE, ENERGY):
            flat = 7.7e10 if m == ENERGY else BASE[m]
            samples = [(t, special if (m == metric and t == FIRST) else flat) for t in TIMES]
            families.setdefault(m, []).append((labels, samples))
        families.setdefault(UP, []).append(
            ({k: labels[k] for k in ("instance", "job", "node")}, [(t, 1.0) for t in TIMES])
        )
    return families


def _live(server: Any, joiner: NodeJoiner) -> CollectedSignals:
    with PrometheusClient(server.url) as client:
        return collect_live(client, joiner, Window(END, WINDOW, STEP), Policy(), "node")


def _snapshot_files(server: Any, joiner: NodeJoiner) -> CollectedSignals:
    """What ``rightsizer snapshot`` records (one file per ``observation_queries`` query), decoded as
    ``plan --snapshot`` decodes it."""
    files: dict[str, dict[str, Any]] = {}
    with PrometheusClient(server.url) as client:
        for q in observation_queries():
            start, end = q.span(END, WINDOW, STEP)
            doc = json.loads(client.query_range_raw(q.expr(STEP, WINDOW), start, end, STEP))
            kind, stem = file_kind(q.path.removeprefix("metrics/").removesuffix(".json"))
            files.setdefault(kind, {})[stem] = _parse_matrix(stem, doc)
    return signals_from_observation(files, joiner, Window(END, WINDOW, STEP), Policy().gpu_activity_max_pct)


@pytest.fixture(scope="module")
def server(prometheus_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.prometheus_server import openmetrics_lines, start_prometheus

    def write(path: Any) -> None:
        with path.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in openmetrics_lines(_families()))

    started = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("first"), write_openmetrics=write)
    yield started
    started.stop()


@pytest.fixture(scope="module", params=[_live, _snapshot_files], ids=["live", "snapshot"])
def signals(server: Any, request: pytest.FixtureRequest) -> dict[str, DeviceSignals]:
    base = snapshot([gpu_node(n, gpus=1, ip=f"10.8.0.{i}") for i, n in enumerate(CASES)], [], {})
    got = request.param(server, NodeJoiner(base.nodes, base.pods, "node"))
    assert not got.problems, got.problems
    return {node: devices[0] for node, devices in got.devices.items()}


def test_activity_at_the_first_instant_is_the_maximum_of_the_oldest_step(
    signals: dict[str, DeviceSignals],
) -> None:
    oldest = WINDOW // STEP - 1
    for node in ("activity-util", "activity-prof"):
        assert signals[node].activity_max_pct == pytest.approx(90.0), node
        assert signals[node].active_steps == frozenset({oldest}), node
    assert signals["control"].activity_max_pct == 0.0


def test_window_maxima_count_the_first_instant(signals: dict[str, DeviceSignals]) -> None:
    assert signals["framebuffer"].fb_used_max_mib == 15000.0
    assert signals["power"].power_max_w == 300.0
    assert signals["control"].fb_used_max_mib == 300.0 and signals["control"].power_max_w == 27.0


def test_spread_average_and_nonfinite_count_the_first_instant(signals: dict[str, DeviceSignals]) -> None:
    assert signals["stddev"].liveness == "moving"
    assert signals["control"].liveness == "frozen"
    assert FB_FREE in signals["avg"].non_finite
    assert GPU_UTIL in signals["nonfinite"].non_finite
    assert signals["control"].non_finite == ()


def test_scrape_count_counts_the_first_instant(signals: dict[str, DeviceSignals]) -> None:
    # 121 scrape attempts in [end − W, end] at 15 s
    assert signals["control"].sample_interval_s == pytest.approx(WINDOW / 121)
