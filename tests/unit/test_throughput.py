"""Throughput-aware rightsizing (issue 17): never a slower GPU model, same-model shapes first, NVLink kept.

Figures come from the packaged catalog (``ec2-gpu-instances.csv``, ``gpu-models.csv``); each row's
arithmetic is in its comment so a changed figure fails loudly.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rightsizer.domain.catalog import load_catalog, parse_gpu_models
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.throughput import Demand, cheapest_fit
from tests.builders import const, gpu_node, node_devices, pod, snapshot

CATALOG = load_catalog()


def demand(
    gpus: int, activity: float | None, fb_gib: float, pod_gpus: int = 1, *, mig: bool = False
) -> Demand:
    return Demand(
        gpus=gpus,
        fb_per_gpu_mib=fb_gib * 1024 * 1.2,
        activity_pct=activity,
        pod_gpus=pod_gpus,
        cpu_m=0,
        memory_mib=0.0,
        mig=mig,
        headroom=0.2,
    )


CASES = [
    # (current type, demand, expected target or None)
    # A10G x4 at 60 %: L4 has 300 GB/s < 600 x 0.6 x 1.2 = 432 GB/s; T4 is an older compute capability.
    ("g5.12xlarge", demand(4, 60, 10), None),
    # A10G x4 at 20 %: L4 covers 16.8 TFLOPS / 144 GB/s and g6.12xlarge is cheaper (4.6016 < 5.672).
    ("g5.12xlarge", demand(4, 20, 10), "g6.12xlarge"),
    # 4 of 8 A10Gs busy at 90 %: the same model's 4-GPU shape, no throughput question.
    ("g5.48xlarge", demand(4, 90, 10), "g5.12xlarge"),
    # 8 x A100-40 at 10 % with one 8-GPU pod: L4/A10G would cover the throughput but have no NVLink.
    ("p4d.24xlarge", demand(8, 10, 10, pod_gpus=8), None),
    # ...the same load as eight 1-GPU pods may go to 8 x L4 (37.4 TFLOPS <= 121, 187 GB/s <= 300).
    ("p4d.24xlarge", demand(8, 10, 10, pod_gpus=1), "g6.48xlarge"),
    # 8 x H100 saturated (BUG-03): nothing cheaper is as fast.
    ("p5.48xlarge", demand(8, 100, 70, pod_gpus=8), None),
    # 2 of 8 H100s busy at 20 %: A100/L40S are an older compute capability, GB202 publishes no dense figure.
    ("p5.48xlarge", demand(2, 20, 30), None),
    # One H200 at 30 % with 60 GiB: an H100 covers 356 TFLOPS / 1,728 GB/s and holds 72 GiB.
    ("p5en.48xlarge", demand(1, 30, 60), "p5.4xlarge"),
    # ...at 80 % the H100's 3,350 GB/s is below 4,800 x 0.8 x 1.2 = 4,608 GB/s.
    ("p5en.48xlarge", demand(1, 80, 60), None),
    # One busy L40S of four with 20 GiB (24 GiB with headroom > any L4/A10G): the 1-GPU L40S shape.
    ("g6e.12xlarge", demand(1, 20, 20), "g6e.xlarge"),
    # One L40S at 20 %: L4 covers 87 TFLOPS / 207 GB/s.
    ("g6e.xlarge", demand(1, 20, 10), "g6.xlarge"),
    # ...at 40 % it needs 415 GB/s > 300; the A10G is an older compute capability.
    ("g6e.xlarge", demand(1, 40, 10), None),
    # A busy L4: nothing cheaper (fractional g6f shapes have no published share of the GPU).
    ("g6.xlarge", demand(1, 90, 10), None),
    # 2 of 4 V100s at 30 % (45 TFLOPS, 324 GB/s): T4 (320 GB/s) and L4 (300) fall short, the A10G fits.
    ("p3.8xlarge", demand(2, 30, 10), "g5.12xlarge"),
    # A T4 shape with the same single GPU and smaller pods: the cheapest T4 shape.
    ("g4dn.2xlarge", demand(1, 50, 8), "g4dn.xlarge"),
    # A100-80 x8, 4 busy at 40 % with 30 GiB: the A100-40 covers 150 TFLOPS / 979 GB/s; L40S (864) does not.
    ("p4de.24xlarge", demand(4, 40, 30), "p4d.24xlarge"),
    # ...with 50 GiB nothing cheaper holds 60 GiB per GPU with a published throughput.
    ("p4de.24xlarge", demand(4, 40, 50), None),
    # Unknown activity: the same model is still fine, another model is never chosen.
    ("g5.48xlarge", demand(1, None, 10), "g5.xlarge"),
    ("g6e.xlarge", demand(1, None, 10), None),
    # MIG slices report activity per slice: no move across models.
    ("g6e.xlarge", demand(1, 20, 10, mig=True), None),
    # B200 rows carry no compute capability in the catalog: no recommendation at all.
    ("p6-b200.48xlarge", demand(1, 10, 10), None),
    # RTX PRO 4500: compute unknown, so the same model's smaller shape only.
    ("g7.12xlarge", demand(1, 50, 10), "g7.2xlarge"),
]


@pytest.mark.parametrize(
    ("current", "need", "expected"), CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)]
)
def test_cheapest_fit_table(current: str, need: Demand, expected: str | None) -> None:
    row = CATALOG.get(current)
    assert row is not None
    fit = cheapest_fit(row, CATALOG, need)
    assert (fit.row.name if fit else None) == expected
    if fit is not None:
        assert fit.expected_slowdown_pct == 0
        assert fit.why_safe


def test_a_busy_node_is_never_sent_to_a_slower_model() -> None:
    """Every catalog type x activity x GPU count: a cross-model target covers the peak on both axes."""
    activities = [1.0, 10.0, 25.0, 50.0, 75.0, 100.0]
    checked = 0
    for row, activity, pod_gpus in itertools.product(CATALOG.types.values(), activities, (1, 2, 8)):
        gpus = min(max(row.gpu_count, 1), pod_gpus)
        fit = cheapest_fit(row, CATALOG, demand(gpus, activity, 4, pod_gpus=pod_gpus))
        if fit is None:
            continue
        target = fit.row
        assert target.hourly_usd is not None and row.hourly_usd is not None
        assert target.hourly_usd < row.hourly_usd
        assert target.gpu_count >= gpus
        if (target.gpu_model, target.gpu_memory_mib) == (row.gpu_model, row.gpu_memory_mib):
            continue
        src, dst = CATALOG.performance_of(row), CATALOG.performance_of(target)
        assert src and dst and src.tensor_tflops and src.memory_bandwidth_gbps
        assert dst.tensor_tflops and dst.memory_bandwidth_gbps
        assert dst.tensor_tflops >= src.tensor_tflops * activity / 100 * 1.2
        assert dst.memory_bandwidth_gbps >= src.memory_bandwidth_gbps * activity / 100 * 1.2
        if pod_gpus > 1 and src.nvlink and row.gpu_count > 1:
            assert dst.nvlink and target.gpu_count > 1
        checked += 1
    assert checked > 20  # the property was exercised on real cross-model moves


def test_every_catalog_gpu_model_has_published_figures_with_a_source() -> None:
    models = {(r.gpu_model, r.gpu_memory_mib) for r in CATALOG.types.values() if r.gpu_count >= 1}
    assert models <= set(CATALOG.performance)
    for perf in CATALOG.performance.values():
        assert perf.source and perf.memory_bandwidth_gbps
    h100 = CATALOG.performance[("NVIDIA H100", 81920)]
    assert (h100.tensor_tflops, h100.memory_bandwidth_gbps, h100.nvlink, h100.mig) == (989, 3350, True, True)


def test_gpu_model_table_rejects_a_bad_boolean() -> None:
    text = (
        "gpu_model,gpu_memory_mib_per_gpu,dense_bf16_tflops,dense_fp16_tflops,memory_bandwidth_gbps,nvlink,mig,"
        "source\nX,1,1,1,1,yes,false,s\n"
    )
    with pytest.raises(ValueError, match="nvlink must be true or false"):
        parse_gpu_models(text)


def _a10g_node(activity: float) -> tuple[Any, list[Any], Any]:
    node = gpu_node("a10", instance_type="g5.12xlarge", gpus=4)
    metrics = node_devices("a10", 4, util=const(activity), fb_used=const(10240), power=const(150))
    pods = [pod(f"infer-{i}", "a10", gpus=1, cpu="2", memory="8Gi") for i in range(4)]
    return node, pods, metrics


def test_plan_keeps_a_busy_a10g_node_off_l4_when_bandwidth_falls_short() -> None:
    node, pods, metrics = _a10g_node(60)
    result = plan(snapshot([node], pods, metrics), Policy())
    assert result.actions == [] and result.node("a10").verdict == "busy"


def test_plan_moves_a_lightly_busy_a10g_node_to_l4_and_says_why() -> None:
    node, pods, metrics = _a10g_node(20)
    result = plan(snapshot([node], pods, metrics), Policy())
    [action] = result.actions
    assert action.to["instance_type"] == "g6.12xlarge" and action.expected_slowdown_pct == 0
    assert "memory bandwidth 300 >= 144 GB/s" in action.why_safe
    assert "compute 121 >= 16.8 TFLOPS" in action.why_safe
    # A stricter headroom makes the same load too much for the L4: 600 x 0.2 x 2.6 = 312 GB/s > 300.
    strict = plan(snapshot([node], pods, metrics), Policy(throughput_headroom=1.6))
    assert strict.actions == []
