"""The resize's driver preflight end to end (issue 17): a resize to another GPU model whose minimum NVIDIA
driver the node's AMI does not meet — or whose installed driver nobody reports — is refused before anything
is touched: no cordon, no eviction, no EC2 call, the lease and budget slot released; the ledger names why.

GIVEN the busy standalone g5.4xlarge (A10G) of ``test_resize_statemachine`` whose plan says
``resize_instance`` → g6.xlarge (L4, minimum driver 520.61.05 in ``gpu-drivers.csv``), WHEN the resize runs
through ``infra/statemachine/drain.asl.json`` (and in-process) THEN: GPU Feature Discovery labels saying
470.57.02 refuse it (``driver_too_old``, even with ``resize_allow_unknown_driver``); no labels refuse it
(``driver_version_unknown``) unless the operator set ``resize_allow_unknown_driver: true``; 535.247.01
lets it run to a Node Ready as g6.xlarge.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rightsizer.domain.model import ANN_CORDONED_BY
from rightsizer.handler_io import use_drain_workflow
from rightsizer.services.resize import ResizeRequest
from rightsizer.services.runner import InProcessRunner
from tests.integration.test_resize_statemachine import (
    EXECUTION,
    NODE,
    World,
    asl,
    assert_serving_as,
    make_world,
    node,
    request,
)

pytestmark = pytest.mark.integration

TARGET = "g6.xlarge"  # NVIDIA L4: another GPU model than the A10G of the g5.4xlarge


def world_with_driver(version: str | None, policy: dict[str, Any] | None = None) -> World:
    w = make_world(policy=policy)
    obj = copy.deepcopy(node(w))
    if version is not None:
        major, minor, rev = version.split(".")
        obj["metadata"]["labels"].update(
            {
                "nvidia.com/cuda.driver-version.full": version,
                "nvidia.com/cuda.driver-version.major": major,
                "nvidia.com/cuda.driver-version.minor": minor,
                "nvidia.com/cuda.driver-version.revision": rev,
            }
        )
    obj["metadata"].pop("resourceVersion", None)
    w.cluster.add_node(obj)
    return w


def run_asl(w: World) -> Any:
    use_drain_workflow(w.workflow)
    try:
        return asl(w).run(request(TARGET), EXECUTION)
    finally:
        use_drain_workflow(None)


def assert_untouched(w: World, reason: str) -> None:
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == "abandoned"
    n = node(w)
    assert not n["spec"].get("unschedulable") and ANN_CORDONED_BY not in n["metadata"].get("annotations", {})
    assert w.cluster.evictions == [] and w.ec2.calls == []  # refused before the EC2 preflight, too
    assert (w.ec2.state, w.ec2.instance_type) == ("running", "g5.4xlarge")
    assert w.state.get(NODE) is None and w.state.slots() == []
    [entry] = w.state.entries(EXECUTION)
    assert entry.result == "abandoned" and entry.reason.startswith(f"preflight:{reason}:"), entry.reason
    assert "NVIDIA L4" in entry.reason


@pytest.mark.parametrize("allow_unknown", [False, True])
def test_a_driver_older_than_the_targets_minimum_is_refused_with_nothing_cordoned(
    allow_unknown: bool,
) -> None:
    w = world_with_driver("470.57.02", policy={"resize_allow_unknown_driver": allow_unknown})
    run = run_asl(w)
    assert run.status == "SUCCEEDED" and run.output["drain"]["status"] == "abandoned", (run.error, run.output)
    assert_untouched(w, "driver_too_old")
    [entry] = w.state.entries(EXECUTION)
    assert "470.57.02" in entry.reason and "520.61.05" in entry.reason


def test_an_unknown_driver_is_refused_with_nothing_cordoned() -> None:
    w = world_with_driver(None)
    run = run_asl(w)
    assert run.output["drain"]["status"] == "abandoned", (run.error, run.output)
    assert_untouched(w, "driver_version_unknown")
    [entry] = w.state.entries(EXECUTION)
    assert "resize_allow_unknown_driver" in entry.reason


def test_the_operator_override_lets_an_unknown_driver_through_in_process() -> None:
    w = world_with_driver(None, policy={"resize_allow_unknown_driver": True})
    InProcessRunner(w.workflow, sleep=w.clock.advance).start(
        ResizeRequest(NODE, EXECUTION, target_type=TARGET)
    )
    assert_serving_as(w, TARGET)
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == "succeeded"
    assert str(record.details["driver_check"]).startswith("unknown_driver_allowed")


def test_a_supported_driver_resizes_to_the_other_model_through_the_state_machine() -> None:
    w = world_with_driver("535.247.01")
    run = run_asl(w)
    assert run.status == "SUCCEEDED" and run.output["drain"]["status"] == "succeeded", (run.error, run.cause)
    assert_serving_as(w, TARGET)
    assert w.ec2.calls == [f"preflight {TARGET}", "stop", f"set_type {TARGET}", f"start {TARGET}"]
    record = w.state.load(EXECUTION)
    assert record is not None and str(record.details["driver_check"]).startswith("driver_supported")
