"""The plan's ``replace_node_group`` action (issue 17, ``rightsizer.domain.replacement``).

GIVEN a managed node group of g5.12xlarge nodes, WHEN every node is underutilized and the group opted in
(``allow_replace_node_group`` and tag ``rightsizer.io/enabled=true``), THEN one executable action replaces
the group with the type serving the *combined* peak of its nodes, priced per node, and the nodes' own
recommendations are gone; any other node state, a missing opt-in or an instance without a Node keeps the
per-node recommendations and executes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.model import TAG_ENABLED
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.replacement import combined_demand
from rightsizer.domain.throughput import Demand
from tests.builders import AT, asg, const, gpu_node, merge_metrics, node_devices, pod, snapshot

GROUP = "gpu-a10g"
PRICE = {name: load_catalog().get(name).hourly_usd for name in ("g5.12xlarge", "g5.xlarge", "g6e.xlarge")}  # type: ignore[union-attr]


def busy(node: str, fb: float = 6000, busy_gpus: int = 1, util: float = 40) -> dict[str, Any]:
    hot = {"util": const(util), "fb_used": const(fb), "power": const(150)}
    return node_devices(node, 4, per_gpu=dict.fromkeys(range(busy_gpus), hot))


def group_plan(
    devices: dict[str, dict[str, Any]],
    *,
    allowed: bool = True,
    tagged: bool = True,
    extra_instances: int = 0,
) -> Plan:
    nodes = [
        gpu_node(name, instance_type="g5.12xlarge", gpus=4, instance_id=f"i-{i:017x}", nodegroup=GROUP)
        for i, name in enumerate(devices)
    ]
    ids = [f"i-{i:017x}" for i in range(len(devices) + extra_instances)]
    group = asg(f"eks-{GROUP}", ids, min_size=1, nodegroup=GROUP)
    if tagged:
        group = dataclasses.replace(group, tags={TAG_ENABLED: "true"})
    pods = [pod(f"infer-{i}", name, gpus=1, cpu="2", memory="8Gi") for i, name in enumerate(devices)]
    snap = snapshot(nodes, pods, merge_metrics(*devices.values()), groups=[group])
    return plan(snap, Policy(allow_replace_node_group=allowed, cooldown=0), AT)


def kinds(result: Plan) -> list[tuple[str, str | None, Any]]:
    return sorted((a.kind, a.node or a.node_group, a.to) for a in result.actions)


def test_an_opted_in_group_of_underutilized_nodes_is_replaced_as_a_whole() -> None:
    result = group_plan({"n1": busy("n1"), "n2": busy("n2")})
    assert kinds(result) == [("replace_node_group", GROUP, "g5.xlarge")]
    (action,) = result.actions
    assert (action.node, action.instance_id, action.from_) == (None, None, "g5.12xlarge")
    saved = (PRICE["g5.12xlarge"] - PRICE["g5.xlarge"]) * 2  # type: ignore[operator]
    assert action.hourly_savings_usd == pytest.approx(saved)
    assert result.savings.hourly_usd == pytest.approx(saved)  # executable: counted
    assert action.expected_slowdown_pct == 0 and "same GPU" in action.why_safe
    assert [r.verdict for r in result.nodes] == ["underutilized", "underutilized"]


def test_the_combined_peak_decides_the_type_not_the_smallest_node() -> None:
    # n2's busy GPU holds 20,000 MiB: with 20 % headroom no A10G (23,028 MiB) fits it, an L40S does
    result = group_plan({"n1": busy("n1"), "n2": busy("n2", fb=20000)})
    assert kinds(result) == [("replace_node_group", GROUP, "g6e.xlarge")]
    assert result.actions[0].hourly_savings_usd == pytest.approx(
        (PRICE["g5.12xlarge"] - PRICE["g6e.xlarge"]) * 2
    )  # type: ignore[operator]


@pytest.mark.parametrize(
    ("case", "kwargs", "devices"),
    [
        ("policy off", {"allowed": False}, None),
        ("group not tagged", {"tagged": False}, None),
        ("an instance without a Node", {"extra_instances": 1}, None),
        ("a node busy on all GPUs", {}, {"n1": busy("n1"), "n2": busy("n2", busy_gpus=4, util=95)}),
        ("an idle node", {}, {"n1": busy("n1"), "n2": node_devices("n2", 4)}),
    ],
)
def test_anything_but_an_opted_in_group_of_underutilized_nodes_executes_nothing(
    case: str, kwargs: dict[str, Any], devices: dict[str, dict[str, Any]] | None
) -> None:
    result = group_plan(devices or {"n1": busy("n1"), "n2": busy("n2")}, **kwargs)
    assert "replace_node_group" not in [a.kind for a in result.actions], case
    recommends = [a for a in result.actions if a.kind == "recommend"]
    assert recommends and all(a.hourly_savings_usd is None for a in recommends), case


def test_combined_demand_takes_each_dimension_maximum() -> None:
    a = Demand(1, 7200.0, 40.0, 1, 2000, 8192.0, False, 0.2)
    b = Demand(2, 3000.0, None, 0, 6000, 1024.0, True, 0.2)
    assert combined_demand([a, b]) == Demand(2, 7200.0, None, 1, 6000, 8192.0, True, 0.2)
    with pytest.raises(ValueError, match="no demand"):
        combined_demand([])
