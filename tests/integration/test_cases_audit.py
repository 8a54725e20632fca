"""Cases audit against a real Prometheus: non-finite samples in metrics other than activity/FB-used/power.

GIVEN DCGM series backfilled into a real Prometheus where one node's ``DCGM_FI_DEV_FB_FREE`` and another's
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` carry ``NaN``/``+Inf`` for a few scrapes inside the window,
WHEN ``rightsizer snapshot`` records the ``query_range`` answers (``"+Inf"`` strings on the wire) and
``plan`` reads them,
THEN those nodes are ``unknown`` (``non_finite:<metric>``), never idle (cases README: non-finite ⇒ unknown).

The live path (``collect_live``) flags them too: it has a non-finite query per device metric.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import ENERGY, FB_FREE
from tests.builders import AT
from tests.integration.test_prometheus import (
    Cluster,
    base_snapshot,
    energy_counter,
    live_snapshot,
    snapshot_path,
)

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

POLICY = Policy(max_nodes_per_run=10, max_nodes_per_node_group=10)


def _poison(c: Cluster, metric: str, uuid: str, value: float) -> None:
    """Replace the samples of ``metric`` for device ``uuid`` 700..580 s before ``at`` with ``value``."""
    end = AT.timestamp()
    for labels, samples in c.families[metric]:
        if labels.get("UUID") == uuid:
            samples[:] = [(t, value if end - 700 < t <= end - 580 else v) for t, v in samples]


def _cluster() -> Cluster:
    c = Cluster()
    for i, name in enumerate(("gpu-clean", "gpu-fbfree", "gpu-energy"), start=1):
        exp, ip = c.node(name, i)
        for g in range(4):
            c.device(exp, ip, g, f"GPU-{name}-{g}", energy=energy_counter(30.0))
        c.up(ip)
    _poison(c, FB_FREE, "GPU-gpu-fbfree-1", math.inf)
    _poison(c, ENERGY, "GPU-gpu-energy-2", math.nan)
    return c


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return _cluster()


@pytest.fixture
def server(cluster: Cluster, prometheus_factory: Any) -> PrometheusServer:
    return prometheus_factory(cluster.families)


def test_snapshot_path_non_finite_fb_free_and_energy_are_unknown(
    cluster: Cluster, server: PrometheusServer
) -> None:
    result = plan(snapshot_path(server, base_snapshot(cluster)), POLICY)
    assert result.node("gpu-clean").verdict == "idle", result.node("gpu-clean").reasons
    fb, energy = result.node("gpu-fbfree"), result.node("gpu-energy")
    assert fb.verdict == "unknown" and f"non_finite:{FB_FREE}" in fb.reasons
    assert energy.verdict == "unknown" and f"non_finite:{ENERGY}" in energy.reasons
    assert {a.node for a in result.actions if a.kind == "scale_in"} == {"gpu-clean"}


def test_live_path_non_finite_fb_free_and_energy_are_unknown(
    cluster: Cluster, server: PrometheusServer
) -> None:
    live, _ = live_snapshot(server, base_snapshot(cluster), POLICY)
    result = plan(live, POLICY)
    assert result.node("gpu-fbfree").verdict == "unknown"
    assert result.node("gpu-energy").verdict == "unknown"
