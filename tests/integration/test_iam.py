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
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from rightsizer.adapters import eks_auth
from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.domain.model import ANN_CORDONED_BY, TAG_ENABLED
from rightsizer.domain.workflow_details import ResizeDetails
from rightsizer.state import WorkflowRecord
from rightsizer.testing.k8s import RecordedRequest
from rightsizer.testing.moto_eks import ACCOUNT_ID, seed_instance
from rightsizer.testing.moto_gaps import place_in_reservation
from rightsizer.wiring import clear_lambda_runtime as clear_caches
from tests.builders import claim_volume, gpu_node, pod, pv, pvc
from tests.integration.test_handlers import (
    POLICY,
    ROOT,
    TABLE,
    Deployment,
    LambdaContextStub,
    deployment,
    event,
    handler,
)
from tests.integration.test_statemachine import LambdaContext
from tests.support import rbac
from tests.support.iam import (
    ALWAYS_ALLOWED,
    Call,
    Lookup,
    Request,
    Resolver,
    RolePolicy,
    load_template,
    recording,
    requests_of,
)

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

__all__ = ["deployment"]  # the fixture, re-used from test_handlers

POLICY_PARAMETER = "/rightsizer/policy"
TOKEN = "iam-test-webhook-token"
LINK_KEY = "iam-test-approval-link-key"  # its own secret, never derived from TOKEN (issue 26)


@dataclass
class Deployed:
    """The deployment plus what the template's parameters resolve to on the local servers."""

    base: Deployment
    endpoint_url: str
    session: boto3.session.Session
    parameters: dict[str, str]
    token_secret_arn: str = ""
    link_key_secret_arn: str = ""
    topic_arn: str = ""
    #: Kubernetes requests each function made, under the ClusterRoles its identity is bound to.
    k8s: dict[str, list[RecordedRequest]] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        return self.base.cluster.cluster

    def resolver(self) -> Resolver:
        table_arn = f"arn:aws:dynamodb:us-east-1:123456789012:table/{TABLE}"
        return Resolver(
            load_template(),
            {"ClusterName": self.cluster, **self.parameters},
            refs={
                "StateTable": TABLE,
                "DrainStateMachine": self.base.state_machine_arn,
                "WebhookTokenSecret": self.token_secret_arn or "arn:aws:secretsmanager:none",
                "ApprovalLinkKeySecret": self.link_key_secret_arn or "arn:aws:secretsmanager:none-key",
                "AlarmTopic": self.topic_arn or "arn:aws:sns:none",
                "ObservePolicy": "ObservePolicy",
                "StartDrainPolicy": "StartDrainPolicy",
            },
            attrs={"StateTable.Arn": table_arn},
        )


@pytest.fixture
def deployed(deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployed]:
    """Acting (``DryRun=false`` and the policy's ``dry_run: false``), the policy in SSM, the real EKS
    authentication path (``eks:DescribeCluster``, a presigned token) pointed at the Kubernetes double."""
    endpoint_url = deployment.sfn.meta.endpoint_url
    session = boto3.session.Session(region_name="us-east-1")
    session.client("ssm", endpoint_url=endpoint_url).put_parameter(
        Name=POLICY_PARAMETER,
        Type="SecureString",
        Value=POLICY + "dry_run: false\nrelease_reserved_capacity: true\n",
    )
    # One spot instance in the cluster: the inventory prices it (ec2:DescribeSpotPriceHistory).
    seed_instance(deployment.cluster.nodegroups["gpu-a10g"].instance_ids[1], lifecycle="spot")
    # gpu-idle runs in an On-Demand Capacity Reservation (ec2:DescribeCapacityReservations); the policy
    # releases reserved capacity so the flows still drain it.
    ec2 = session.client("ec2", endpoint_url=endpoint_url)
    odcr = ec2.create_capacity_reservation(
        InstanceType="g5.2xlarge",
        InstancePlatform="Linux/UNIX",
        AvailabilityZone="us-east-1a",
        InstanceCount=1,
    )["CapacityReservation"]["CapacityReservationId"]
    place_in_reservation(
        ACCOUNT_ID, "us-east-1", deployment.cluster.nodegroups["gpu-a10g"].instance_ids[0], odcr
    )
    deployment.double.set_resource_api_versions(("v1",))  # DRA served: its reads are part of the flows
    monkeypatch.setenv("RIGHTSIZER_DRY_RUN", "false")
    monkeypatch.setenv("RIGHTSIZER_POLICY_PARAMETER", POLICY_PARAMETER)
    monkeypatch.setenv("RIGHTSIZER_POLICY_INLINE", "")
    monkeypatch.delenv("RIGHTSIZER_KUBE_CONTEXT")
    # The real DescribeCluster runs on moto; only its answer's CA and endpoint are replaced by the double's.
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text("unused over http\n", encoding="utf-8")
    monkeypatch.setattr(eks_auth, "write_ca_bundle", lambda _pem, _directory: ca_file)
    for_eks = KubernetesCluster.for_eks.__func__  # type: ignore[attr-defined]

    def at_the_double(cls: type[KubernetesCluster], _endpoint: str, tokens: Any, **kwargs: Any) -> Any:
        return for_eks(cls, deployment.double.base_url, tokens, **kwargs)

    monkeypatch.setattr(KubernetesCluster, "for_eks", classmethod(at_the_double))
    clear_caches()
    yield Deployed(
        deployment, endpoint_url, session, {"PolicyParameterName": POLICY_PARAMETER, "DryRun": "false"}
    )
    clear_caches()


def verify_role(deployed: Deployed, role: str, calls: list[Call]) -> RolePolicy:
    """Assert the three rules of the module docstring for ``role`` over ``calls``."""
    assert calls, "the flow made no AWS call"
    policy = RolePolicy(deployed.resolver(), role)
    lookup = Lookup(deployed.session, deployed.endpoint_url)
    undeclared: set[tuple[str, str]] = set()
    missing: list[Request] = []
    used: set[tuple[str, str]] = set()
    for call in calls:
        for request in requests_of(call, lookup, table=TABLE):
            if request.action not in getattr(sys.modules[call.owner], "IAM_ACTIONS", ()):
                undeclared.add((call.owner, request.action))
            if request.action in ALWAYS_ALLOWED:
                continue
            allowing = policy.allowing(request)
            if not allowing:
                missing.append(request)
            used |= {(s.where, a) for s, a in allowing}
            used |= {(s.where, k) for s, _ in allowing for k in s.matched_keys(request)}
    unused = sorted(policy.grants() - used)
    assert not undeclared, f"modules call actions they do not declare in IAM_ACTIONS: {sorted(undeclared)}"
    assert not missing, "denied by template.yaml:\n" + "\n".join(
        f"  {r.action} on {r.resource} {dict(r.context)} (from {r.owner})" for r in missing
    )
    assert not unused, f"{role} holds grants its code never used: {unused}"
    return policy


@contextmanager
def as_function(
    deployed: Deployed, function: str, conditions: frozenset[str] = frozenset()
) -> Iterator[None]:
    """Run the block as ``function``'s Kubernetes identity: the double enforces exactly the ClusterRoles
    ``infra/k8s/rbac.yaml`` binds to its access entry's groups (for the template ``conditions`` that
    hold; a missing verb answers 403, which fails the flow); the requests are kept for the unused-verb
    check."""
    double = deployed.base.double
    double.bind_cluster_role(rbac.function_role(function, conditions))
    double.clear_requests()
    try:
        yield
    finally:
        requests = double.requests
        double.bind_cluster_role(None)
        deployed.k8s.setdefault(function, []).extend(requests)
    forbidden = [(r.method, r.path) for r in requests if r.status == 403]
    assert not forbidden, f"{function}: RBAC of infra/k8s/rbac.yaml refused {forbidden}"


def verify_rbac(
    deployed: Deployed,
    functions: Iterable[str],
    conditions: frozenset[str] = frozenset(),
    roles: Iterable[str] | None = None,
) -> None:
    """Every verb of each ClusterRole bound only to ``functions`` (or of ``roles`` among them) was used by
    their requests."""
    functions = set(functions)
    bound: dict[str, set[str]] = {}
    for function in rbac.FUNCTION_ROLES:
        for role in rbac.cluster_roles_of(function, conditions):
            bound.setdefault(role, set()).add(function)
    checked = [role for role, users in bound.items() if users <= functions]
    if roles is not None:
        assert set(roles) <= set(checked), (sorted(roles), checked)
        checked = list(roles)
    assert checked, f"no ClusterRole is bound only to {sorted(functions)}"
    requests = [r for f in functions for r in deployed.k8s.get(f, [])]
    for role in checked:
        definition = rbac.function_role_named(role)
        unused = rbac.unused(definition, requests)
        assert not unused, f"ClusterRole {role} grants verbs {sorted(functions)} never used: {unused}"


def run_drain(deployed: Deployed, start: dict[str, Any]) -> dict[str, Any]:
    """Start, then step the drain handler until the workflow ends (waits advance the double's clock)."""
    drain = handler("drain")
    result = drain(start, LambdaContext())
    for _ in range(40):
        if result["next_step"] is None:
            return result
        deployed.base.double.advance(float(result.get("wait_seconds") or 0) + 1)
        result = drain({"action": "step", "execution_id": result["execution_id"]}, LambdaContext())
    raise AssertionError(f"drain did not end: {result}")


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


def drain_flow(deployed: Deployed) -> list[Call]:
    """A whole drain of gpu-idle (a DaemonSet pod stays; pods of a StatefulSet on a network volume, of a
    ReplicaSet, of a ReplicationController and of a Job opted in with safe-to-evict are evicted, each
    controller read back first) and a late rollback of it; returns the AWS calls."""
    double = deployed.base.double
    # The drained node runs on spot: validate judges that node alone (issue 11 item 5), and pricing it
    # is what needs ec2:DescribeSpotPriceHistory in the drain role.
    seed_instance(deployed.base.cluster.nodegroups["gpu-a10g"].instance_ids[0], lifecycle="spot")
    exporter = pod("dcgm-exporter-x", "gpu-idle", namespace="monitoring", owner=("DaemonSet", "apps/v1"))
    double.add_daemonset(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "dcgm-exporter-x-owner", "namespace": "monitoring"},
            "spec": {"selector": {"matchLabels": {"app": "dcgm"}}, "template": {"spec": {"containers": []}}},
        }
    )
    # The exporter holds a DRA claim (a NIC, not a GPU): the one-node read lists its namespace's claims.
    exporter["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimName": "exporter-nic"}]
    double.add_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "exporter-nic", "namespace": "monitoring"},
            "spec": {
                "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}
            },
        }
    )
    double.add_pod(exporter)
    double.add_pvc(pvc("data-db-0", "pv-ebs", namespace="web"))
    # A volume with a required node affinity (on the region label these nodes carry): the one-node read
    # looks for another schedulable Node it reaches (a list of Nodes by selector) before it may call the
    # claim portable.
    double.add_pv(pv("pv-ebs", affinity={"topology.kubernetes.io/region": ["us-east-1"]}))
    double.add_pod(
        pod(
            "db-0",
            "gpu-idle",
            namespace="web",
            owner=("StatefulSet", "apps/v1"),
            volumes=[claim_volume("data-db-0")],
            grace=0,
        )
    )
    for name, owner, extra in (
        ("web-1", ("ReplicaSet", "apps/v1"), {}),
        ("legacy-1", ("ReplicationController", "v1"), {}),
        ("warmup-1", ("Job", "batch/v1"), {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}),
    ):
        double.add_pod(pod(name, "gpu-idle", namespace="web", owner=owner, annotations=extra, grace=0))
    asg = deployed.base.cluster.nodegroups["gpu-a10g"].asg_name
    autoscaling = deployed.session.client("autoscaling", endpoint_url=deployed.endpoint_url)

    with (
        as_function(deployed, "drain"),
        recording(Lookup(deployed.session, deployed.endpoint_url)) as recorder,
    ):
        done = run_drain(deployed, event("drain-start"))
        # and a late rollback of the finished workflow (the state machine's Catch path)
        handler("drain")(event("drain-rollback"), LambdaContext())

    assert done["status"] == "succeeded", done
    sizes = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
    assert sizes["DesiredCapacity"] == 2  # exactly the drained instance was removed
    assert any(c.action == "autoscaling:TerminateInstanceInAutoScalingGroup" for c in recorder.calls)
    return recorder.calls


def approval_flow(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """A drain of gpu-idle under ``approval: required`` that nobody answers: validated, the request opened
    and published (SNS; links signed with the approval-link key, its own secret), then abandoned at the
    timeout with nothing cordoned; returns the AWS calls. The policy is put back afterwards."""
    endpoint = deployed.endpoint_url
    deployed.topic_arn = deployed.session.client("sns", endpoint_url=endpoint).create_topic(
        Name="rightsizer-alarms"
    )["TopicArn"]
    secrets = deployed.session.client("secretsmanager", endpoint_url=endpoint)
    deployed.link_key_secret_arn = secrets.create_secret(Name="rightsizer-link-key", SecretString=LINK_KEY)[
        "ARN"
    ]
    monkeypatch.setenv("RIGHTSIZER_APPROVAL_TOPIC_ARN", deployed.topic_arn)
    monkeypatch.setenv("RIGHTSIZER_APPROVAL_URL", "https://abc123.lambda-url.us-east-1.on.aws/")
    monkeypatch.setenv("RIGHTSIZER_APPROVAL_KEY_SECRET", "rightsizer-link-key")
    # the drain never reads the webhook token (issue 26): it is not even configured for it
    monkeypatch.delenv("RIGHTSIZER_WEBHOOK_TOKEN_SECRET", raising=False)
    monkeypatch.delenv("RIGHTSIZER_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("RIGHTSIZER_APPROVAL_KEY", raising=False)
    ssm = deployed.session.client("ssm", endpoint_url=endpoint)
    asking = (
        POLICY + "dry_run: false\napproval: required\napproval_timeout: 1\nrelease_reserved_capacity: true\n"
    )
    ssm.put_parameter(Name=POLICY_PARAMETER, Type="SecureString", Value=asking, Overwrite=True)
    clear_caches()
    start = json.loads(json.dumps(event("drain-start")))
    execution = start["request"]["execution_id"] = "gpu-idle-approval-0123456789"
    drain = handler("drain")
    try:
        with (
            as_function(deployed, "drain"),
            recording(Lookup(deployed.session, endpoint)) as recorder,
        ):
            drain(start, LambdaContext())
            waiting = drain({"action": "step", "execution_id": execution}, LambdaContext())
            assert waiting["next_step"] == "approval", waiting
            drain(
                {"action": "request_approval", "execution_id": execution, "task_token": "tok-1"},
                LambdaContext(),
            )
            time.sleep(1.2)  # approval_timeout: 1 s, on the drain's real clock
            done = drain({"action": "step", "execution_id": execution}, LambdaContext())
    finally:
        ssm.put_parameter(
            Name=POLICY_PARAMETER,
            Type="SecureString",
            Value=POLICY + "dry_run: false\nrelease_reserved_capacity: true\n",
            Overwrite=True,
        )
        clear_caches()
    assert (done["status"], done["message"]) == ("abandoned", "approval_timeout"), done
    node = deployed.base.double.get_node(start["request"]["node"])
    assert node is not None and not node["spec"].get("unschedulable")
    assert any(c.action == "sns:Publish" for c in recorder.calls)
    return recorder.calls


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


# ------------------------------------------------------------------------------------------ resize

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
