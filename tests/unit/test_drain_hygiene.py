"""Drain loop hygiene (issue 12 §5): no step loops without a wait, eviction-unsupported is a clear
permanent error, savings are booked only when our instance left and the group shrank, a lingering Node
of a gone instance is not idle."""

from __future__ import annotations

import dataclasses
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients, AwsInventory
from rightsizer.domain.errors import TransientError
from rightsizer.domain.model import Ec2Instance, Inventory
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.ports import EvictionOutcome, TerminateResult
from rightsizer.services.drain import DrainRequest
from rightsizer.services.runner import InProcessRunner
from tests.builders import AT, asg, gpu_node, merge_metrics, node_devices, pod, snapshot
from tests.unit.test_drain import make_world, reasons


def test_eviction_answered_404_while_the_pod_exists_fails_clearly_and_waits_between_calls() -> None:
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30)])
    world.writer.script_eviction("default", "web-1", *[EvictionOutcome("gone", "the server could not find the requested resource")] * 50)  # fmt: skip
    record = world.drain()
    assert record.status == "failed"
    assert "eviction_unsupported:default/web-1" in reasons(world)[-1][2]
    evictions = [e for e in world.writer.evictions if e[1] == "web-1"]
    assert len(evictions) == 1  # no loop: one answer is enough to know
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.writer.get_pod("default", "web-1") is not None and world.scaler.terminated == []


def test_a_404_for_a_pod_that_really_went_away_is_done() -> None:
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30)])

    def vanish() -> EvictionOutcome:
        world.writer.remove_pod("default", "web-1")
        return EvictionOutcome("gone", "not found")

    original = world.writer.evict
    world.writer.evict = lambda ns, name, uid: vanish() if name == "web-1" else original(ns, name, uid)  # type: ignore[method-assign]
    assert world.drain().status == "succeeded"


def test_every_non_final_step_result_waits_or_moves_on() -> None:
    """No step repeats itself with a zero wait (a blocked eviction, a stuck pod, a slow instance)."""
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30)])
    world.writer.script_eviction("default", "web-1", *[EvictionOutcome("blocked", "pdb web")] * 5)
    results = []
    runner = InProcessRunner(world.workflow(), sleep=world.clock.advance, progress=results.append)
    runner.start(DrainRequest("gpu-1", "exec-1"))
    assert world.state.load("exec-1").status == "succeeded"
    assert all(r.wait_seconds > 0 for r in results if r.next_step == r.step)


def test_savings_are_booked_only_when_our_instance_left_and_the_group_shrank() -> None:
    world = make_world()
    original = world.scaler.terminate

    def replaced_by_someone(asg_name: str, instance_id: str) -> TerminateResult:
        # the instance was already gone: someone else removed/replaced it
        return dataclasses.replace(original(asg_name, instance_id), already_done=True)

    world.scaler.terminate = replaced_by_someone  # type: ignore[method-assign]
    record = world.drain()
    assert record.status == "succeeded"
    [entry] = [e for e in world.state.entries(execution_id="exec-1") if e.step == "verify"]
    assert entry.hourly_savings_usd is None and "no savings booked" in entry.reason
    honest = make_world()
    assert honest.drain().status == "succeeded"
    [booked] = [e for e in honest.state.entries(execution_id="exec-1") if e.step == "verify"]
    assert booked.hourly_savings_usd is not None and booked.hourly_savings_usd > 0


def test_a_lingering_node_of_a_terminated_instance_is_not_idle() -> None:
    nodes = [gpu_node("gpu-1", instance_type="g5.xlarge", gpus=1, instance_id="i-1")]
    metrics = merge_metrics(node_devices("gpu-1", 1))
    for state, expect in (("terminated", "protected"), ("shutting-down", "protected"), ("running", "idle")):
        snap = snapshot(
            nodes, [], metrics, groups=[asg("eks-gpu-asg", ["i-1"], nodegroup="gpu-a10g", desired=3)]
        )
        instances = {"i-1": Ec2Instance("i-1", "g5.xlarge", {}, "ebs", state)}
        inventory = Inventory(True, snap.inventory.groups, snap.inventory.asg_of_instance, instances)
        report = plan(snap.__class__(**{**snap.__dict__, "inventory": inventory}), Policy(), AT).node("gpu-1")
        assert report.verdict == expect, (state, report.reasons)
        if expect == "protected":
            assert f"other_autoscaler:instance_{state}" in report.reasons


@pytest.fixture
def garbage_endpoint() -> Iterator[str]:
    """An HTTP endpoint answering every call with a load balancer's HTML page (status 200)."""

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"<html><body><h1>502 Bad Gateway</h1>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.HTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize(
    ("service", "call", "operation"),
    [
        (
            "autoscaling",
            lambda c: AutoScalingGroups(c).describe_group("eks-gpu-asg"),
            "DescribeAutoScalingGroups",
        ),
        ("autoscaling", lambda c: AutoScalingGroups(c).find_group("i-1"), "DescribeAutoScalingInstances"),
        ("ec2", lambda c: AwsInventory(_clients(ec2=c)).describe_instances(["i-1"]), "DescribeInstances"),
    ],
    ids=["asg-sizes", "asg-membership", "ec2-instances"],
)
def test_an_aws_answer_botocore_cannot_parse_is_a_transient_error_not_a_traceback(
    garbage_endpoint: str, service: str, call: Callable[[Any], Any], operation: str
) -> None:
    client = boto3.client(service, region_name="us-east-1", endpoint_url=garbage_endpoint,  # type: ignore[call-overload]
                          aws_access_key_id="AKID", aws_secret_access_key="secret")  # fmt: skip
    with pytest.raises(TransientError, match=operation):
        call(client)


def _clients(**overrides: Any) -> AwsClients:
    base = {name: None for name in ("ec2", "eks", "autoscaling")}
    return AwsClients(**{**base, **overrides})  # type: ignore[arg-type]
