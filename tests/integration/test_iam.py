"""IAM = what the code calls, both ways, per function role (issue 14).

Each function's handler runs its flows as deployed (the template's ``RIGHTSIZER_*`` settings, acting, the
EKS authentication path) against moto in server mode, the Kubernetes double and a real Prometheus. Every
AWS call the product makes is recorded (``tests.support.iam``) and

1. must be declared in the ``IAM_ACTIONS`` of the module that made it;
2. must be allowed by the role's policies in ``template.yaml`` — resolved for the same parameters, with
   resource ARNs, resource tags and ``dynamodb:LeadingKeys`` taken from the real call (missing grant);
3. and every (statement, action) the role holds must have allowed at least one call (unused grant).

The opt-in rule is proven from both sides: the drain refuses a group without ``rightsizer.io/enabled``
before it cordons, and the template's condition would deny the scale-in there anyway.

The drain role with ``EnableResize=true`` is proven in ``test_iam_resize``; the deployment both hold the
roles on (the ``deployed`` fixture) and the checks and flows they share are in ``tests.support.iam_world``.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.domain.model import ANN_CORDONED_BY, TAG_ENABLED
from rightsizer.domain.workflow_details import ResizeDetails
from rightsizer.state import WorkflowRecord
from rightsizer.testing.moto_eks import ACCOUNT_ID
from rightsizer.testing.moto_gaps import place_in_reservation
from rightsizer.wiring import clear_lambda_runtime as clear_caches
from tests.builders import gpu_node
from tests.integration.test_handlers import ROOT, TABLE, LambdaContextStub, deployment, event, handler
from tests.integration.test_statemachine import LambdaContext
from tests.support import rbac
from tests.support.iam import Call, Lookup, Request, RolePolicy, recording, requests_of
from tests.support.iam_world import (
    LINK_KEY,
    Deployed,
    approval_flow,
    as_function,
    deployed,
    drain_flow,
    run_drain,
    verify_rbac,
    verify_role,
)

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

__all__ = ["deployed", "deployment"]  # the fixtures, re-used from tests.support.iam_world and test_handlers

TOKEN = "iam-test-webhook-token"


PROMETHEUS_VARIANTS = {
    # name: (PrometheusAuth, secret reference, username, how the secret is created)
    "none": ("none", "", ""),
    "sigv4": ("sigv4", "", ""),
    "bearer-secretsmanager": ("bearer", "secretsmanager:rightsizer/prometheus", ""),
    "basic-ssm": ("basic", "ssm:/rightsizer/prometheus-password", "grafana"),
}


@pytest.mark.parametrize("variant", sorted(PROMETHEUS_VARIANTS))
def test_assess_role_holds_exactly_what_the_assessment_calls(
    deployed: Deployed, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth, reference, username = PROMETHEUS_VARIANTS[variant]
    scheme, _, name = reference.partition(":")
    if scheme == "secretsmanager":
        deployed.session.client("secretsmanager", endpoint_url=deployed.endpoint_url).create_secret(
            Name=name, SecretString="prom-token"
        )
    elif scheme == "ssm":
        deployed.session.client("ssm", endpoint_url=deployed.endpoint_url).put_parameter(
            Name=name, Type="SecureString", Value="prom-password"
        )
    monkeypatch.setenv("RIGHTSIZER_PROMETHEUS_AUTH", auth)
    monkeypatch.setenv("RIGHTSIZER_PROMETHEUS_SECRET", reference)
    monkeypatch.setenv("RIGHTSIZER_PROMETHEUS_USERNAME", username)
    deployed.parameters.update(
        {"PrometheusAuth": auth, "PrometheusSecretRef": reference, "PrometheusUsername": username}
    )
    clear_caches()
    # GIVEN the lease and budget slot of a drain that died hours before the tick: the assessment heals
    # both, and reaps the slot of a second one that never got its lease
    tick = event("assess-tick")
    before = datetime.fromisoformat(tick["scheduled_time"].replace("Z", "+00:00")) - timedelta(hours=3)
    state = DynamoDbState(
        deployed.session.client("dynamodb", endpoint_url=deployed.endpoint_url), TABLE, deployed.cluster
    )
    asg = deployed.base.cluster.nodegroups["gpu-a10g"].asg_name
    assert state.acquire("gpu-busy", "died", before, 60) is not None
    cordon(deployed, "gpu-busy", "died")
    cordon(deployed, "gpu-idle-2", "lost")  # our cordon without any lease: a stale cordon, healed too
    for node, owner in (("gpu-busy", "died"), ("gpu-other", "lost")):
        slot = state.take_slot(
            asg, node, owner, before, max_per_run=5, max_per_group=5, desired=3, min_size=1
        )
        assert hasattr(slot, "taken_at"), slot
    # ... and a resize that died after stopping its instance: the assessment reads its record (GetItem
    # wf#) and restarts it as a new execution of the drain state machine, which restores the instance.
    resize = WorkflowRecord(
        execution_id="resize-died", node="gpu-resized", instance_id="i-0123456789abcdef0", step="stopped",
        status="running", started_at=before, deadline=before + timedelta(minutes=10), lease_epoch=1,
        details=ResizeDetails(kind="resize_instance", stopping=True, target_type="g5.xlarge"),
    )  # fmt: skip
    state.save(resize, expected_version=0)
    assert state.acquire("gpu-resized", "resize-died", before, 60) is not None

    with (
        as_function(deployed, "assess"),
        recording(Lookup(deployed.session, deployed.endpoint_url)) as recorder,
    ):
        summary = handler("assess")(tick, LambdaContext(function_name="rightsizer-assess"))

    assert summary["started"], summary  # it planned, and started drains
    assert summary["reaped_slots"] == 1 and state.slots() == [], summary
    assert summary["healed"] == ["gpu-resized", "gpu-busy", "gpu-idle-2"], summary
    restarted = deployed.session.client("stepfunctions", endpoint_url=deployed.endpoint_url)
    names = [
        e["name"]
        for m in restarted.list_state_machines()["stateMachines"]
        for e in restarted.list_executions(stateMachineArn=m["stateMachineArn"])["executions"]
    ]
    assert "resize-died-r2" in names, names
    verify_role(deployed, "AssessRole", recorder.calls)
    verify_rbac(deployed, ["assess"])


def test_webhook_role_holds_exactly_what_the_intake_calls(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = deployed.session.client("secretsmanager", endpoint_url=deployed.endpoint_url)
    deployed.token_secret_arn = secrets.create_secret(Name="rightsizer-webhook", SecretString=TOKEN)["ARN"]
    deployed.link_key_secret_arn = secrets.create_secret(Name="rightsizer-link-key", SecretString=LINK_KEY)[
        "ARN"
    ]
    monkeypatch.setenv("RIGHTSIZER_WEBHOOK_TOKEN_SECRET", "rightsizer-webhook")
    monkeypatch.setenv("RIGHTSIZER_APPROVAL_KEY_SECRET", "rightsizer-link-key")
    monkeypatch.delenv("RIGHTSIZER_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("RIGHTSIZER_APPROVAL_KEY", raising=False)
    monkeypatch.delenv("RIGHTSIZER_CONFIG", raising=False)
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    webhook = importlib.import_module("alert_webhook.app")
    webhook.use_intake(None)
    firing = event("alert-webhook-firing")
    firing["headers"]["authorization"] = f"Bearer {TOKEN}"
    resolved = json.loads(json.dumps(firing))
    body = json.loads(resolved["body"])
    body["status"] = "resolved"
    body["alerts"][0]["status"] = "resolved"
    resolved["body"] = json.dumps(body)
    resolved["requestContext"]["requestId"] = "c0ffee00-0000-4000-8000-000000000002"
    state = DynamoDbState(
        deployed.session.client("dynamodb", endpoint_url=deployed.endpoint_url), TABLE, deployed.cluster
    )
    try:
        with (
            as_function(deployed, "webhook"),
            recording(Lookup(deployed.session, deployed.endpoint_url)) as recorder,
        ):
            # cold start (token, policy), a firing delivery and its duplicate …
            answers = [webhook.lambda_handler(e, LambdaContextStub()) for e in (firing, firing)]
            # … the drain took its lease (validate) and the resolve records a cancel for it
            (started,) = json.loads(answers[0]["body"])["started"]
            assert state.acquire(started["node"], started["execution_id"], datetime.now(UTC), 600)
            answers.append(webhook.lambda_handler(resolved, LambdaContextStub()))
            # … and a delivery whose drain cannot start: Powertools drops its in-progress record
            # … two approval links: an approve (SendTaskSuccess) and a snooze (a snooze item, SendTaskFailure)
            answers += approval_links(deployed, webhook)
            deployed.base.sfn.delete_state_machine(stateMachineArn=deployed.base.state_machine_arn)
            again = json.loads(json.dumps(firing))
            again["body"] = firing["body"].replace("280e8540395e9bb0", "0123456789abcdef")
            again["requestContext"]["requestId"] = "c0ffee00-0000-4000-8000-000000000003"
            answers.append(webhook.lambda_handler(again, LambdaContextStub()))
    finally:
        webhook.use_intake(None)

    assert [a["statusCode"] for a in answers][:5] == [202, 200, 202, 200, 200], answers
    assert json.loads(answers[5]["body"])["failed"], answers[5]
    actions = {c.action for c in recorder.calls}
    assert {"states:SendTaskSuccess", "states:SendTaskFailure"} <= actions, actions
    verify_role(deployed, "AlertWebhookRole", recorder.calls)
    # The webhook has no access entry and never talks to Kubernetes.
    assert rbac.groups_of("webhook") == [] and deployed.k8s["webhook"] == []


def approval_links(deployed: Deployed, webhook: Any) -> list[dict[str, Any]]:
    """POST an approve link and a snooze link of two waiting drains to the webhook; returns the answers."""
    from urllib.parse import urlencode

    from rightsizer.adapters.dynamodb_approvals import DynamoDbApprovals
    from rightsizer.domain.approval import ApprovalClaims, derive_key, sign_token
    from rightsizer.localserve import function_url_event
    from rightsizer.state import ApprovalRequest

    store = DynamoDbApprovals(
        deployed.session.client("dynamodb", endpoint_url=deployed.endpoint_url), TABLE, deployed.cluster
    )
    now = datetime.now(UTC)
    answers = []
    for n, action in ((1, "approve"), (2, "snooze")):
        expires = now + timedelta(hours=1)
        store.open_approval(
            ApprovalRequest(f"exec-{n}", f"gpu-{n}", f"nonce-{n}", now, expires, task_token=f"tok-{n}")
        )
        claims = ApprovalClaims(action, deployed.cluster, f"exec-{n}", f"nonce-{n}", int(expires.timestamp()),  # type: ignore[arg-type]
                                3600 if action == "snooze" else 0)  # fmt: skip
        body = urlencode({"token": sign_token(derive_key(LINK_KEY), claims)}).encode()
        link = function_url_event(
            method="POST",
            path="/approval",
            headers={"content-type": "application/x-www-form-urlencoded"},
            body=body,
        )
        answers.append(webhook.lambda_handler(link, LambdaContextStub()))
    return answers


def test_drain_role_holds_exactly_what_a_drain_calls(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = approval_flow(deployed, monkeypatch) + drain_flow(deployed)
    policy = verify_role(deployed, "DrainRole", calls)
    assert not any(a.startswith("ec2:") and not a.startswith("ec2:Describe") for _, a in policy.grants())


def cordon(deployed: Deployed, node: str, execution_id: str) -> None:
    """Mark ``node`` cordoned by us for ``execution_id`` (what that drain's cordon step left)."""
    double = deployed.base.double
    obj = double.get_node(node)
    assert obj is not None
    obj["spec"]["unschedulable"] = True
    obj["metadata"].setdefault("annotations", {})[ANN_CORDONED_BY] = execution_id
    double.delete_node(node, delete_pods=False)
    double.add_node(obj)


def offhours_flow(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """A night (sizes saved, a drain started, the drain seen in flight) and a morning (restore through
    EKS, then complete); returns the AWS calls."""
    # The off-hours window is around the real now: its drain assesses the node on the metrics the
    # Prometheus of the deployment holds up to now (an unknown node is never drained).
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    window = {"start": f"{now - timedelta(hours=1):%H:%M}", "end": f"{now + timedelta(hours=1):%H:%M}"}
    night = [{"days": days, **window, "timezone": "UTC"}]
    monkeypatch.setenv(
        "RIGHTSIZER_OFFHOURS",
        json.dumps({"schedules": {"night": night}, "node_groups": [{"name": "gpu-l4", "schedule": "night"}]}),
    )
    clear_caches()
    tick = event("offhours-tick")
    # node gpu-idle (idle DCGM series) becomes the one node of gpu-l4
    group = deployed.base.cluster.nodegroups["gpu-l4"]
    deployed.base.double.delete_node("gpu-idle")
    node = gpu_node(
        "gpu-idle", instance_type="g6.xlarge", gpus=1, instance_id=group.instance_ids[0], nodegroup="gpu-l4"
    )
    deployed.base.double.add_node(node)
    # in an On-Demand Capacity Reservation (released by the policy): the tick's assessment reads it
    ec2 = deployed.session.client("ec2", endpoint_url=deployed.endpoint_url)
    odcr = ec2.create_capacity_reservation(
        InstanceType="g6.xlarge",
        InstancePlatform="Linux/UNIX",
        AvailabilityZone="us-east-1a",
        InstanceCount=1,
    )["CapacityReservation"]["CapacityReservationId"]
    place_in_reservation(ACCOUNT_ID, "us-east-1", group.instance_ids[0], odcr)
    autoscaling = deployed.session.client("autoscaling", endpoint_url=deployed.endpoint_url)
    offhours: Callable[[dict[str, Any], Any], dict[str, Any]] = handler("offhours")

    def run(at: str) -> dict[str, Any]:
        report = offhours(dict(tick, scheduled_time=at), LambdaContext(function_name="rightsizer-offhours"))
        (found,) = [g for g in report["groups"] if g["node_group"] == "gpu-l4"]
        return dict(found)

    with (
        as_function(deployed, "offhours"),
        recording(Lookup(deployed.session, deployed.endpoint_url)) as recorder,
    ):
        # night: sizes saved, the node's drain started through the state machine
        down = run(f"{now:%Y-%m-%dT%H:%M:%SZ}")
        assert down["error"] is None and down["drains"][0]["status"] == "started", json.dumps(down)
        # (its drain cordoned the node: the next tick sees the drain in flight through its lease)
        cordon(deployed, "gpu-idle", down["drains"][0]["execution_id"])
        waiting = run(f"{now + timedelta(minutes=5):%Y-%m-%dT%H:%M:%SZ}")
        assert waiting["error"] is None, waiting
        # (the drain removed the node, the group went to zero)
        deployed.base.double.delete_node("gpu-idle")
        deployed.session.client("eks", endpoint_url=deployed.endpoint_url).update_nodegroup_config(
            clusterName=deployed.cluster,
            nodegroupName="gpu-l4",
            scalingConfig={"minSize": 0, "desiredSize": 0, "maxSize": 2},
        )
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=group.asg_name, MinSize=0, DesiredCapacity=0
        )
        # morning: the saved sizes are restored through EKS …
        up = run(f"{now + timedelta(hours=2):%Y-%m-%dT%H:%M:%SZ}")
        assert up["outcome"] == "restoring" and up["error"] is None, up
        # … and once the node is back and Ready the restore completes and the sizes are forgotten
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=group.asg_name, MinSize=0, DesiredCapacity=1
        )
        deployed.base.double.add_node(node)
        done = run(f"{now + timedelta(hours=2, minutes=5):%Y-%m-%dT%H:%M:%SZ}")
        assert done["outcome"] == "restored", done

    actions = {c.action for c in recorder.calls}
    assert {"eks:UpdateNodegroupConfig", "states:StartExecution", "dynamodb:DeleteItem"} <= actions, actions
    return recorder.calls


def test_offhours_role_holds_exactly_what_a_down_and_up_cycle_calls(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    verify_role(deployed, "OffhoursRole", offhours_flow(deployed, monkeypatch))
    # Its own Kubernetes identity (issue 26: it was bound to the drain's ClusterRole, patch and evict
    # included, though its cycle only lists): every verb of rightsizer-offhours used, none refused.
    verify_rbac(deployed, ["offhours"])
    assert {verb for _, _, verb in rbac.used(deployed.k8s["offhours"])} <= {"list", "create"}


def test_with_replacement_the_drains_extra_group_holds_exactly_the_fresh_plans_reads(
    deployed: Deployed,
) -> None:
    # GIVEN node group replacement enabled: the drain's access entry adds the group rightsizer-replace
    replace = frozenset({"ReplaceNodeGroups"})
    assert rbac.cluster_roles_of("drain", replace) == ["rightsizer", "rightsizer-replace"]
    from rightsizer.wiring import lambda_runtime

    # WHEN the replacement's fresh plan observes the cluster (ReplaceWorkflow's planner) as the drain
    with as_function(deployed, "drain", replace):
        snapshot = lambda_runtime().observe_fresh(datetime.now(UTC))

    # THEN it read the whole cluster, and every verb of rightsizer-replace was used, none refused
    assert snapshot.nodes
    verify_rbac(deployed, ["drain"], replace, roles=["rightsizer-replace"])


def test_every_kubernetes_identity_is_one_functions_own() -> None:
    # Each function's access entry groups are bound to ClusterRoles no other function's groups reach, so
    # each test above proves one identity against one function's flows alone (with or without replacement).
    for conditions in (frozenset(), frozenset({"ReplaceNodeGroups"})):
        bound: dict[str, set[str]] = {}
        for function in rbac.FUNCTION_ROLES:
            for role in rbac.cluster_roles_of(function, conditions):
                bound.setdefault(role, set()).add(function)
        assert {role: sorted(users) for role, users in bound.items() if len(users) > 1} == {}
    assert {f: rbac.cluster_roles_of(f) for f in rbac.FUNCTION_ROLES} == {
        "assess": ["rightsizer-heal", "rightsizer-read"],
        "drain": ["rightsizer"],
        "offhours": ["rightsizer-offhours"],
        "webhook": [],
    }


def test_a_group_that_did_not_opt_in_is_refused_before_the_cordon_and_denied_by_iam(
    deployed: Deployed,
) -> None:
    # GIVEN the drained node's Auto Scaling group lost its opt-in tag (a system group, say)
    asg = deployed.base.cluster.nodegroups["gpu-a10g"].asg_name
    autoscaling = deployed.session.client("autoscaling", endpoint_url=deployed.endpoint_url)
    autoscaling.delete_tags(
        Tags=[{"ResourceId": asg, "ResourceType": "auto-scaling-group", "Key": TAG_ENABLED, "Value": "true"}]
    )
    node = event("drain-start")["request"]["node"]

    # WHEN its drain runs
    done = run_drain(deployed, event("drain-start"))

    # THEN validate refused it, nothing was cordoned and the group keeps its size
    assert (done["status"], done["step"]) == ("abandoned", "validate"), done
    assert f"not_opted_in:{TAG_ENABLED}" in done["message"], done
    after = deployed.base.double.get_node(node)
    assert after is not None and not after["spec"].get("unschedulable")
    # AND the template would deny the scale-in there anyway (and allows it once tagged again)
    policy = RolePolicy(deployed.resolver(), "DrainRole")
    instance = deployed.base.cluster.nodegroups["gpu-a10g"].instance_ids[0]
    call = Call("autoscaling:TerminateInstanceInAutoScalingGroup", {"InstanceId": instance}, "test")
    lookup = Lookup(deployed.session, deployed.endpoint_url)
    (request,) = requests_of(call, lookup, table=TABLE)
    assert policy.allowing(request) == []
    autoscaling.create_or_update_tags(
        Tags=[
            {"ResourceId": asg, "ResourceType": "auto-scaling-group", "Key": TAG_ENABLED, "Value": "true",
             "PropagateAtLaunch": True}
        ]
    )  # fmt: skip
    (request,) = requests_of(call, lookup, table=TABLE)
    assert [s.where for s, _ in policy.allowing(request)] == ["DrainRole/act/ScaleInOptedInGroupsOnly"]


def test_with_price_list_api_false_no_role_may_ask_prices_and_the_assessment_never_does(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the stack deployed with PriceListApi=false (a VPC without a route to the Price List endpoint)
    monkeypatch.setenv("RIGHTSIZER_PRICING_API", "false")
    deployed.parameters["PriceListApi"] = "false"
    clear_caches()

    # WHEN the scheduled assessment runs
    with (
        as_function(deployed, "assess"),
        recording(Lookup(deployed.session, deployed.endpoint_url)) as recorder,
    ):
        summary = handler("assess")(event("assess-tick"), LambdaContext(function_name="rightsizer-assess"))

    # THEN it planned on the packaged prices without asking the Price List API once
    assert summary["started"], summary
    actions = {c.action for c in recorder.calls}
    assert "ec2:DescribeInstances" in actions and "pricing:GetProducts" not in actions, sorted(actions)
    # AND no function role holds pricing:GetProducts: a call would be denied
    ask = Request("pricing:GetProducts", "*", {}, "test")
    for role in ("AssessRole", "AlertWebhookRole", "DrainRole", "OffhoursRole"):
        policy = RolePolicy(deployed.resolver(), role)
        assert not any(a == "pricing:GetProducts" for _, a in policy.grants()), role
        assert policy.allowing(ask) == [], role
