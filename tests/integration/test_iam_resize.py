"""IAM of the instance resize (``EnableResize=true``) = what its code calls, both ways (the rules of test_iam).

With the stack deployed with ``EnableResize=true`` and the policy's ``allow_resize``, the drain function
runs an approval, a drain and a whole resize of a standalone instance (stop, type-only modify, start, the
kubelet re-registering the Node) on moto, the Kubernetes double and a real Prometheus. The ``DrainRole``
must allow every call, every grant of it (the resize statements included) must have allowed one, the
ClusterRole bound to the drain must be used whole, and the type-only condition must deny any other
attribute of the instance.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from rightsizer.wiring import clear_lambda_runtime as clear_caches
from tests.builders import gpu_node, pod
from tests.integration.test_handlers import POLICY, TABLE, deployment, handler
from tests.integration.test_statemachine import LambdaContext
from tests.support.iam import Call, Lookup, recording, requests_of
from tests.support.iam_world import (
    POLICY_PARAMETER,
    Deployed,
    approval_flow,
    as_function,
    deployed,
    drain_flow,
    verify_rbac,
    verify_role,
)

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

__all__ = ["deployed", "deployment"]  # the fixtures, re-used from tests.support.iam_world and test_handlers


RESIZE_NODE = "ip-10-0-9-21.ec2.internal"


def resize_flow(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """A whole resize of an opted-in standalone g5.4xlarge to g5.xlarge through the drain handler (the
    same state machine tasks), with a kubelet re-registering the Node; returns the AWS calls.

    The fresh decision is pinned to "underutilized" (planning has its own tests); everything else is the
    deployed code: the policy from SSM with ``allow_resize``, EC2 on moto, the Node on the double.
    """
    from rightsizer.adapters.aws import make_clients
    from rightsizer.domain.plan import NodeReport
    from rightsizer.services.assess import PlanningAssessor
    from rightsizer.testing.moto_eks import launch_standalone
    from rightsizer.testing.periodic import Periodic
    from tests.support.resize_world import Kubelet

    ssm = deployed.session.client("ssm", endpoint_url=deployed.endpoint_url)
    ssm.put_parameter(
        Name=POLICY_PARAMETER,
        Type="SecureString",
        Overwrite=True,
        Value=POLICY
        + "dry_run: false\nallow_resize: true\nresize_allow_instance_store_loss: true\nrelease_reserved_capacity: true\n",
    )
    clear_caches()
    clients = make_clients("us-east-1", deployed.endpoint_url, session=deployed.session)
    instance_id = launch_standalone(clients, "g5.4xlarge", deployed.base.cluster.subnet_ids[0])
    double = deployed.base.double
    double.add_node(
        gpu_node(RESIZE_NODE, instance_type="g5.4xlarge", gpus=1, instance_id=instance_id, nodegroup=None)
    )
    double.add_pod(pod("api-0", RESIZE_NODE, namespace="ml", grace=0, labels={"app": "api"}))
    real_assess = PlanningAssessor.assess_node

    def underutilized(self: PlanningAssessor, node: str, now: Any) -> NodeReport | None:
        if node != RESIZE_NODE:
            return real_assess(self, node, now)
        return NodeReport(
            node=node, verdict="underutilized", reasons=["activity_above_threshold:30%"], node_group=None,
            instance_id=instance_id, instance_type="g5.4xlarge", gpus=1, gpu_activity_max_pct=30.0,
            fb_used_max_mib=4096.0, coverage=1.0, hourly_usd=1.624,
        )  # fmt: skip

    monkeypatch.setattr(PlanningAssessor, "assess_node", underutilized)

    def state() -> tuple[str, str]:
        found = clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        return str(found["State"]["Name"]), str(found["InstanceType"])

    kubelet = Kubelet(double, RESIZE_NODE, state)
    kubelet.sync()
    follower = Periodic(kubelet.sync, "iam-kubelet")
    drain = handler("drain")
    start = {
        "action": "start",
        "request": {"execution_id": f"{RESIZE_NODE}-0011223344556677", "node": RESIZE_NODE,
                    "trigger": "schedule", "target_type": "g5.xlarge"},
    }  # fmt: skip
    follower.start(0.05)
    try:
        with (
            as_function(deployed, "drain"),
            recording(Lookup(deployed.session, deployed.endpoint_url)) as recorder,
        ):
            result = drain(start, LambdaContext())
            for _ in range(400):
                if result["next_step"] is None:
                    break
                double.advance(float(result.get("wait_seconds") or 0) + 1)
                time.sleep(0.05)  # the kubelet follows EC2's state
                result = drain({"action": "step", "execution_id": result["execution_id"]}, LambdaContext())
    finally:
        follower.stop()
    assert result["status"] == "succeeded", result
    assert state() == ("running", "g5.xlarge")
    actions = {c.action for c in recorder.calls}
    assert {"ec2:StopInstances", "ec2:ModifyInstanceAttribute", "ec2:StartInstances"} <= actions, actions
    return recorder.calls


def test_with_enable_resize_the_drain_role_holds_exactly_what_a_drain_and_a_resize_call(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the stack deployed with EnableResize=true: the drain role gains the resize statements
    deployed.parameters["EnableResize"] = "true"
    calls = approval_flow(deployed, monkeypatch) + drain_flow(deployed) + resize_flow(deployed, monkeypatch)

    # THEN every call is granted and every grant — Stop/Start/Modify on opted-in instances, the type-only
    # modify, DescribeInstanceTypes — was used by the flows
    policy = verify_role(deployed, "DrainRole", calls)
    grants = {a for _, a in policy.grants()}
    assert {
        "ec2:StopInstances",
        "ec2:StartInstances",
        "ec2:ModifyInstanceAttribute",
        "ec2:DescribeInstanceTypes",
    } <= grants
    # AND the drain's own Kubernetes identity (ClusterRole rightsizer) holds exactly what these flows of
    # the drain function alone used (no other function is bound to it)
    verify_rbac(deployed, ["drain"])
    # AND the type-only condition bites: modifying another attribute of the same instance is denied
    lookup = Lookup(deployed.session, deployed.endpoint_url)
    instance = next(c.params["InstanceId"] for c in calls if c.action == "ec2:ModifyInstanceAttribute")
    other = Call("ec2:ModifyInstanceAttribute", {"InstanceId": instance, "UserData": {"Value": "x"}}, "test")
    (request,) = requests_of(other, lookup, table=TABLE)
    assert policy.allowing(request) == []
