"""Savings of a cluster outside us-east-1 are that region's (issue 17 "Honest savings"), end to end as a user
runs the CLI (subprocesses).

GIVEN EKS cluster ``prod-eks`` in eu-west-1 on moto (node group ``gpu-a10g``: two g5.2xlarge, one idle, one
busy), the Kubernetes double, a real Prometheus with their dcgm-exporter series, the state table, and the
Price List Query API double serving real eu-west-1 products (g5.2xlarge 1.35296 USD/h; the packaged
catalog's us-east-1 price is 1.212),
WHEN the API is denied THEN ``rightsizer plan`` prices the idle node at the packaged 1.212 with
``price_region_fallback:eu-west-1`` (the figure before this change, for every region);
WHEN it answers THEN ``plan`` prices it at 1.35296 with ``priced_on_demand:pricing_api:eu-west-1``,
``apply --execute`` removes it and books 1.35296 USD/h, and ``status`` and ``savings`` read that figure back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.test_apply import run_cli
from tests.support.e2e_cluster import ExtraPod, GpuCluster, dcgm_families, gpu_cluster, write_config
from tests.support.pricing_double import PricingDouble, pricing_double

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

REGION = "eu-west-1"
EU_WEST_1_G5_2XLARGE = 1.35296  # tests/fixtures/pricing: SKU P2KE3JYU9KQ2RD7B
PACKAGED_G5_2XLARGE = 1.212  # ec2-gpu-instances.csv, us-east-1 of 2026-07-20


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[GpuCluster]:
    trainer = ExtraPod("trainer-7d9f5-x2kqp", 1, {"gpus": 1, "cpu": "6", "memory": "24Gi", "grace": 30})
    with gpu_cluster(tmp_path, nodes=2, extra_pods=[trainer], region=REGION) as (built, _exporter):
        yield built


@pytest.fixture
def prices() -> Iterator[PricingDouble]:
    with pricing_double() as double:
        yield double


@pytest.fixture
def config_file(
    cluster: GpuCluster,
    prices: PricingDouble,
    prometheus_factory: Callable[..., PrometheusServer],
    tmp_path: Path,
) -> Path:
    now = time.time()
    times = [float(int(now)) - 120 + k for k in range(720)]
    idle, busy = cluster.nodes
    server = prometheus_factory(dcgm_families([(idle, "idle"), (busy, "busy")], times))
    return write_config(
        tmp_path / "config.yaml", cluster, server.url, pricing_endpoint_url=prices.endpoint_url
    )


def _plan(config: Path) -> dict[str, Any]:
    code, out, err = run_cli("plan", "--config", str(config), "--json")
    assert code == 0, err[-3000:]
    return out


def test_a_eu_west_1_cluster_plans_removes_and_books_at_eu_west_1_prices(
    cluster: GpuCluster, prices: PricingDouble, config_file: Path
) -> None:
    idle, _busy = cluster.nodes

    # Before: no answer from the API (as every region was priced until now).
    prices.deny = True
    before = _plan(config_file)
    node = next(n for n in before["nodes"] if n["node"] == idle.name)
    assert node["hourly_usd"] == pytest.approx(PACKAGED_G5_2XLARGE)
    assert f"price_region_fallback:{REGION}" in node["reasons"]
    assert before["savings"]["hourly_usd"] == pytest.approx(PACKAGED_G5_2XLARGE)

    # After: the region's price, named as such, in the plan ...
    prices.deny = False
    after = _plan(config_file)
    node = next(n for n in after["nodes"] if n["node"] == idle.name)
    assert node["hourly_usd"] == pytest.approx(EU_WEST_1_G5_2XLARGE)
    assert f"priced_on_demand:pricing_api:{REGION}" in node["reasons"]
    [action] = [a for a in after["actions"] if a["kind"] == "scale_in"]
    assert action["node"] == idle.name
    assert action["hourly_savings_usd"] == pytest.approx(EU_WEST_1_G5_2XLARGE)
    assert after["savings"]["hourly_usd"] == pytest.approx(EU_WEST_1_G5_2XLARGE)
    assert {f["Value"] for r in prices.requests for f in r["Filters"] if f["Field"] == "regionCode"} == {
        REGION
    }

    # ... in what apply books (its validate step re-plans the node: the price is read again) ...
    code, out, err = run_cli("apply", "--config", str(config_file), "--execute", "--json")
    assert code == 0, err[-3000:]
    [(_execution, outcome)] = out["workflows"].items()
    assert outcome["status"] == "succeeded", outcome
    assert idle.instance_id not in cluster.in_service()

    # ... and in status and savings, read back from the ledger.
    code, status, err = run_cli("status", "--config", str(config_file), "--json")
    assert code == 0, err[-3000:]
    [kind] = status["savings"]["by_action_kind"]
    assert (kind["kind"], kind["applied"]) == ("scale_in", 1)
    assert kind["hourly_usd"] == pytest.approx(EU_WEST_1_G5_2XLARGE)
    code, savings, err = run_cli("savings", "--config", str(config_file), "--json")
    assert code == 0, err[-3000:]
    hours = sum(r["instance_hours"] for r in savings["days"])
    assert hours > 0
    assert savings["total_usd"] == pytest.approx(hours * EU_WEST_1_G5_2XLARGE, rel=1e-6)
