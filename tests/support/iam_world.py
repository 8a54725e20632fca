"""The deployed stack the IAM tests hold the roles to, and the flows more than one of those tests runs.

:class:`Deployed` is ``test_handlers``' ``deployment`` (moto in server mode, the Kubernetes double, a real
Prometheus) as the template deploys it, acting: the :func:`deployed` fixture sets ``DryRun=false``, puts the
policy in SSM and sends the real EKS authentication path to the double. A test module imports both fixtures
and lists them in ``__all__`` (as ``deployment`` is shared): this module also exports helpers, so it is
imported before pytest could rewrite its asserts and cannot be a ``pytest_plugins`` plugin.

:func:`verify_role` holds an IAM role of ``template.yaml`` to the AWS calls its function made;
:func:`as_function` runs a block as a function's Kubernetes identity and :func:`verify_rbac` holds the
ClusterRoles bound to it to the requests made. :func:`approval_flow` and :func:`drain_flow` are the drain
function's flows (``test_iam`` proves the drain role on them, ``test_iam_resize`` with ``EnableResize=true``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from rightsizer.adapters import eks_auth
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.testing.k8s import RecordedRequest
from rightsizer.testing.moto_eks import ACCOUNT_ID, seed_instance
from rightsizer.testing.moto_gaps import place_in_reservation
from rightsizer.wiring import clear_lambda_runtime as clear_caches
from tests.builders import claim_volume, pod, pv, pvc
from tests.integration.test_handlers import POLICY, TABLE, Deployment, event, handler
from tests.integration.test_statemachine import LambdaContext
from tests.support import rbac
from tests.support.iam import (
    Call,
    Lookup,
    Resolver,
    RolePolicy,
    judge,
    load_template,
    recording,
)

POLICY_PARAMETER = "/rightsizer/policy"
LINK_KEY = "iam-test-approval-link-key"  # its own secret, never derived from the webhook token (issue 26)


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
    """Assert for ``role`` over ``calls`` (recorded by :func:`tests.support.iam.recording`): every call is
    declared in the ``IAM_ACTIONS`` of the module that made it, allowed by the role's policies in
    ``template.yaml`` (missing grant), and every (statement, action) the role holds allowed one (unused
    grant). Returns the role's resolved policy."""
    assert calls, "the flow made no AWS call"
    policy = RolePolicy(deployed.resolver(), role)
    lookup = Lookup(deployed.session, deployed.endpoint_url)
    judged = judge(policy, calls, lookup, table=TABLE)
    undeclared, missing, used = judged.undeclared, judged.missing, judged.used
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
