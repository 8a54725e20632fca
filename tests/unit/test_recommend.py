"""Recommendations with exact types and honest savings (docs/architecture.md §3 "Recommendations", issue 17).

Prices are the catalog's us-east-1 on-demand figures. A recommendation carries no USD (nothing executes
it); its reason says what it would save.
"""

from __future__ import annotations

from typing import Any

import pytest

from rightsizer.domain.model import Ec2Instance
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import const, gpu_node, node_devices, pod, snapshot


def only_action(result: Plan) -> Any:
    [action] = result.actions
    return action


def test_one_of_four_a10g_busy_with_9_gib_recommends_a_one_gpu_type() -> None:
    node = gpu_node("a10", instance_type="g5.12xlarge", gpus=4)
    metrics = node_devices(
        "a10", 4, per_gpu={0: {"util": const(70), "fb_used": const(9216), "power": const(180)}}
    )
    server = pod("vllm-0", "a10", gpus=1, cpu="2", memory="8Gi")
    result = plan(snapshot([node], [server], metrics), Policy())
    assert result.node("a10").verdict == "underutilized"
    action = only_action(result)
    assert action.kind == "recommend"
    assert action.from_ == "g5.12xlarge"
    assert action.to == {
        "instance_type": "g5.xlarge",
        "mig_profile": None,
        "mig_instances": None,
        "time_slicing_replicas": None,
    }
    assert action.hourly_savings_usd is None and action.monthly_savings_usd is None
    assert f"would save {5.672 - 1.006:.4g} USD/h once applied" in action.reason
    assert "create a new node group" in action.reason and "UpdateNodegroupVersion" in action.reason
    assert action.expected_slowdown_pct == 0 and action.why_safe.startswith("same GPU (NVIDIA A10G)")
    assert result.savings.hourly_usd == 0  # a recommendation is not an executable action


def test_pod_cpu_requests_push_to_a_bigger_one_gpu_type() -> None:
    node = gpu_node("a10", instance_type="g5.12xlarge", gpus=4)
    metrics = node_devices(
        "a10", 4, per_gpu={0: {"util": const(70), "fb_used": const(9216), "power": const(180)}}
    )
    server = pod("vllm-0", "a10", gpus=1, cpu="6", memory="40Gi")  # > g5.xlarge/2xlarge allocatable memory
    action = only_action(plan(snapshot([node], [server], metrics), Policy()))
    assert action.to["instance_type"] == "g5.4xlarge"
    assert f"would save {5.672 - 1.624:.4g} USD/h" in action.reason


def test_peak_70_gib_on_an_h100_fits_no_smaller_h100_and_no_slower_model() -> None:
    node = gpu_node("h1", instance_type="p5.4xlarge", gpus=1, nodegroup="p5")
    metrics = node_devices(
        "h1", 1, util=const(40), fb_used=const(70 * 1024), fb_total=81559, power=const(300)
    )
    result = plan(snapshot([node], [pod("llm-0", "h1", gpus=1)], metrics), Policy())
    # 70 GiB x 1.2 = 86,016 MiB > 81,920 MiB: no H100 type fits. The one cheaper type with the memory
    # (g7e.2xlarge, GB202 96 GiB) has 1,597 GB/s < 3,350 x 40 % x 1.2 = 1,608 GB/s and no published
    # dense tensor figure: it is not offered (before issue 17 it was, a slowdown sold as a saving).
    assert result.actions == [] and result.node("h1").verdict == "busy"


def test_eight_gpus_requested_by_one_pod_means_no_smaller_type() -> None:
    node = gpu_node("p4", instance_type="p4d.24xlarge", gpus=8, nodegroup="p4d")
    metrics = node_devices(  # A100 40 GB: the driver reports 40,536 MiB used + free
        "p4",
        8,
        fb_total=40536,
        per_gpu={0: {"util": const(90), "fb_used": const(30000), "power": const(300)}},
    )
    trainer = pod("train-0", "p4", gpus=8, cpu="90", memory="1000Gi")
    result = plan(snapshot([node], [trainer], metrics), Policy())
    assert result.node("p4").verdict == "busy"
    assert result.actions == []


def test_mig_profile_when_workloads_fit_and_no_cheaper_type_does() -> None:
    node = gpu_node("h8", instance_type="p5.48xlarge", gpus=8, nodegroup="p5")
    busy = {"util": const(10), "fb_used": const(7 * 1024), "fb_total": 81559, "power": const(120)}
    metrics = node_devices("h8", 8, per_gpu={0: busy, 1: busy, 2: busy}, fb_total=81559)
    big = pod("feature-store-0", "h8", cpu="100", memory="1900Gi")  # rules out every cheaper 8-GPU type
    result = plan(snapshot([node], [big], metrics), Policy())
    assert result.node("h8").verdict == "underutilized"
    action = only_action(result)
    assert action.to == {
        "instance_type": None,
        "mig_profile": "1g.10gb",
        "mig_instances": 3,
        "time_slicing_replicas": None,
    }
    # 2 of 8 GPUs freed, but the p5.48xlarge keeps costing 55.04 USD/h: capacity, not USD.
    assert action.hourly_savings_usd is None and result.savings.hourly_usd == 0
    assert "frees 2 of 8 GPUs" in action.reason and "keeps costing 55.04 USD/h" in action.reason
    assert action.expected_slowdown_pct == 0 and "1/7 of the GPU's compute" in action.why_safe
    assert any("mig-configs" in m and '"1g.10gb": 7' in m for m in action.manifests)
    assert any("nvidia.com/mig.config=all-1g.10gb" in m for m in action.manifests)
    assert any("ResourceClaimTemplate" in m for m in action.manifests)


def test_time_slicing_replicas_for_models_without_mig() -> None:
    node = gpu_node("t4", instance_type="g4dn.12xlarge", gpus=4, nodegroup="t4")
    busy = {"util": const(20), "fb_used": const(2048), "fb_total": 15360, "power": const(40)}
    metrics = node_devices("t4", 4, per_gpu={0: busy, 1: busy, 2: busy}, fb_total=15360, power=const(15))
    result = plan(snapshot([node], [], metrics), Policy())
    action = only_action(result)
    # replicas = min(8, 100 // 20, 16384 // (2048 x 1.2)) = 5; 3 workloads fit on 1 GPU, 2 of 4 GPUs freed.
    assert action.to == {
        "instance_type": None,
        "mig_profile": None,
        "mig_instances": None,
        "time_slicing_replicas": 5,
    }
    assert action.hourly_savings_usd is None
    assert "frees 2 of 4 GPUs" in action.reason and "keeps costing 3.912 USD/h" in action.reason
    assert "timeSlicing" in action.manifests[0] and "replicas: 5" in action.manifests[0]


def _standalone(
    tags: dict[str, str], instance_type: str = "g5.4xlarge", labels: dict[str, str] | None = None
) -> Any:
    node = gpu_node(
        "solo", instance_type=instance_type, gpus=1, instance_id="i-solo", nodegroup=None, labels=labels
    )
    metrics = node_devices("solo", 1, util=const(30), fb_used=const(4096), power=const(100))
    snap = snapshot([node], [pod("api-0", "solo", gpus=1, cpu="2", memory="8Gi")], metrics, groups=[])
    instances = {"i-solo": Ec2Instance("i-solo", instance_type, tags, "ebs", "running")}
    return type(snap)(**{**snap.__dict__, "inventory": type(snap.inventory)(True, {}, {}, instances)})


def test_resize_instance_only_for_opted_in_standalone_instances() -> None:
    tagged = _standalone({"rightsizer.io/resize": "allowed"})
    allowed = Policy(allow_resize=True, resize_allow_instance_store_loss=True)
    action = only_action(plan(tagged, allowed))
    assert (action.kind, action.from_, action.to) == ("resize_instance", "g5.4xlarge", "g5.xlarge")
    assert action.hourly_savings_usd == pytest.approx(1.624 - 1.006)
    assert plan(tagged, allowed).savings.hourly_usd == pytest.approx(1.624 - 1.006)
    # g5 types carry instance-store NVMe: without the opt-in the data-loss risk keeps it a recommendation.
    kept = only_action(plan(tagged, Policy(allow_resize=True)))
    assert kept.kind == "recommend" and "resize_allow_instance_store_loss" in kept.reason
    assert only_action(plan(_standalone({}), allowed)).kind == "recommend"
    assert only_action(plan(tagged, Policy())).kind == "recommend"


@pytest.mark.parametrize(
    ("labels", "allow_unknown", "kind", "why"),
    [
        # GPU Feature Discovery labels (NVIDIA/k8s-device-plugin internal/lm/nvml.go): L4 needs >= 520.61.05.
        ({"nvidia.com/cuda.driver-version.full": "535.183.01"}, False, "resize_instance", None),
        (
            {
                "nvidia.com/cuda.driver.major": "520",
                "nvidia.com/cuda.driver.minor": "61",
                "nvidia.com/cuda.driver.rev": "05",
            },
            False,
            "resize_instance",
            None,
        ),
        ({"nvidia.com/cuda.driver-version.full": "520.61.04"}, False, "recommend", "driver_too_old"),
        ({"nvidia.com/cuda.driver-version.full": "470.256.02"}, True, "recommend", "driver_too_old"),
        ({}, False, "recommend", "driver_version_unknown"),
        (
            {"nvidia.com/cuda.driver-version.full": "not-a-version"},
            False,
            "recommend",
            "driver_version_unknown",
        ),
        ({}, True, "resize_instance", None),
    ],
)
def test_a_resize_to_another_gpu_model_is_executable_only_when_its_preflight_will_pass(
    labels: dict[str, str], allow_unknown: bool, kind: str, why: str | None
) -> None:
    """g5.xlarge (A10G) → g6.xlarge (L4): the plan applies the resize validate step's driver rule, so a
    resize validate would refuse is a recommendation (no executable USD) that names the refusal."""
    snap = _standalone({"rightsizer.io/resize": "allowed"}, "g5.xlarge", labels)
    policy = Policy(
        allow_resize=True, resize_allow_instance_store_loss=True, resize_allow_unknown_driver=allow_unknown
    )
    result = plan(snap, policy)
    action = only_action(result)
    assert (action.kind, action.to if kind == "resize_instance" else action.to["instance_type"]) == (
        kind,
        "g6.xlarge",
    )
    if why is None:
        assert result.savings.hourly_usd == pytest.approx(1.006 - 0.8048)
    else:
        assert result.savings.hourly_usd == 0
        assert f"the resize preflight would refuse it: {why}" in action.reason


def test_a_same_model_resize_needs_no_driver_labels() -> None:
    """g5.4xlarge → g5.xlarge keeps the A10G: the driver that drives it now drives it after."""
    action = only_action(
        plan(
            _standalone({"rightsizer.io/resize": "allowed"}),
            Policy(allow_resize=True, resize_allow_instance_store_loss=True),
        )
    )
    assert action.kind == "resize_instance"
