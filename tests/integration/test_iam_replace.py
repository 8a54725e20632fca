"""IAM of the node group replacement (issue 17) = what its code calls, both ways (the rules of test_iam).

The replacement runs through the drain function's handler (``functions/drain/app.py``, one invocation per
state of ``drain.asl.json``) on moto and the Kubernetes double, with a launch template that pins the
instance type and ``replace_delete_old_after`` set, so every call it can make is made. Every AWS call is
recorded with the module that made it; with ``NodeGroupReplacementNodeRoleArn`` set to the old group's
node role the ``DrainRole`` must allow each call, every module must declare its calls in ``IAM_ACTIONS``, and
every grant of the replacement statements must have allowed a call. Without the parameter the role holds
none of them (``test_iam`` proves that role exact for the drain itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import boto3
import pytest

from rightsizer.adapters.aws import AwsClients
from rightsizer.handler_io import use_drain_workflow
from rightsizer.testing.moto_eks import MotoServer
from tests.builders import AT
from tests.integration.test_replace_nodegroup_moto import EXECUTION, NudgingClock, World, make_world
from tests.integration.test_statemachine import AslInterpreter, LambdaContext, drain_handler, load_asl
from tests.support.iam import (
    Lookup,
    Resolver,
    RolePolicy,
    judge,
    load_template,
    recording,
)

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = "rightsizer-state"
NODE_ROLE = "arn:aws:iam::123456789012:role/eks-node"  # the role tests' node groups use (moto_eks)
REPLACE_SIDS = (
    "ReplaceCreateOptedInNodegroups",
    "ReplaceOptedInNodegroups",
    "ReplacePassNodeRole",
    "ReplaceLaunchTemplateVersions",
    "ReplaceDeleteOwnLaunchTemplateVersions",
    "ReplaceReadLaunchTemplates",
)


def drain_role(cluster: str, role_arn: str) -> RolePolicy:
    resolver = Resolver(
        load_template(),
        {"ClusterName": cluster, "NodeGroupReplacementNodeRoleArn": role_arn},
        refs={
            "StateTable": TABLE,
            "DrainStateMachine": "arn:aws:states:us-east-1:123456789012:stateMachine:rightsizer-drain",
            "WebhookTokenSecret": "arn:aws:secretsmanager:none",
            "ApprovalLinkKeySecret": "arn:aws:secretsmanager:none-key",
            "AlarmTopic": "arn:aws:sns:none",
            "ObservePolicy": "ObservePolicy",
            "StartDrainPolicy": "StartDrainPolicy",
        },
        attrs={"StateTable.Arn": f"arn:aws:dynamodb:us-east-1:123456789012:table/{TABLE}"},
    )
    return RolePolicy(resolver, "DrainRole")


#: Used only by a rollback: the launch template version made for the new group is deleted with it.
ROLLBACK_ONLY = {"ReplaceDeleteOwnLaunchTemplateVersions"}


@pytest.fixture
def world(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients)


@pytest.fixture
def no_capacity(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients, no_capacity=frozenset({"g5.xlarge"}))


def _run_recorded(
    world: World, moto_server: MotoServer, boto_session: boto3.session.Session, **policy: Any
) -> tuple[str, Any, Lookup]:
    """The replacement through the drain handler and the ASL, every AWS call recorded."""
    world.clock = NudgingClock(AT)
    groups = world.observed.groups()
    world.observed.groups = lambda: groups  # type: ignore[method-assign]  # the test's reads are not the function's
    workflow = world.workflow(**policy)
    handler, context = drain_handler(), LambdaContext()
    lookup = Lookup(boto_session, moto_server.endpoint_url)
    use_drain_workflow(workflow)
    try:
        with recording(lookup) as recorder:
            interpreter = AslInterpreter(
                load_asl(), lambda _arn, payload: handler(payload, context), world.clock
            )
            run = interpreter.run(asdict(world.request()), EXECUTION)
    finally:
        use_drain_workflow(None)
    return run.status, recorder, lookup


def _judged(recorder: Any, lookup: Lookup) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Holds the recorded calls to the template: returns the replacement grants and those a call used."""
    policy = drain_role("prod-eks", NODE_ROLE)
    judged = judge(policy, recorder.calls, lookup, table=TABLE)
    undeclared, used = judged.undeclared, judged.used
    missing = [(r.action, r.resource, dict(r.context), r.owner) for r in judged.missing]
    assert not undeclared, f"modules call actions they do not declare in IAM_ACTIONS: {sorted(undeclared)}"
    assert not missing, f"denied by template.yaml: {missing}"
    replacement = {(w, a) for w, a in policy.grants() if w.rpartition("/")[2] in REPLACE_SIDS}
    assert {w.rpartition("/")[2] for w, _ in replacement} == set(REPLACE_SIDS)
    return replacement, used


def test_the_drain_role_holds_exactly_what_a_node_group_replacement_calls(
    world: World, moto_server: MotoServer, boto_session: boto3.session.Session
) -> None:
    status, recorder, lookup = _run_recorded(world, moto_server, boto_session, replace_delete_old_after=60)
    assert status == "SUCCEEDED"
    replacement, used = _judged(recorder, lookup)
    unused = {(w, a) for w, a in replacement - used if w.rpartition("/")[2] not in ROLLBACK_ONLY}
    assert not unused, f"replacement grants never used: {sorted(unused)}"
    # a replacement that went through keeps its launch template version: the new group runs it
    assert not {(w, a) for w, a in used if w.rpartition("/")[2] in ROLLBACK_ONLY}


def test_a_rollback_deletes_its_launch_template_version_with_the_grant_it_holds(
    no_capacity: World, moto_server: MotoServer, boto_session: boto3.session.Session
) -> None:
    status, recorder, lookup = _run_recorded(no_capacity, moto_server, boto_session)
    assert status == "FAILED"  # the state machine fails an execution whose workflow rolled back
    record = no_capacity.state.load(EXECUTION)
    assert record is not None and record.status == "rolled_back", record
    replacement, used = _judged(recorder, lookup)
    rollback = {(w, a) for w, a in replacement if w.rpartition("/")[2] in ROLLBACK_ONLY}
    assert rollback and rollback <= used, f"rollback grants never used: {sorted(rollback - used)}"
    deletes = [c for c in recorder.calls if c.action == "ec2:DeleteLaunchTemplateVersions"]
    assert [(c.params["Versions"], c.owner) for c in deletes] == [
        (["2"], "rightsizer.adapters.launch_templates")
    ]
    template = deletes[0].params["LaunchTemplateId"]
    left = no_capacity.clients.ec2.describe_launch_template_versions(LaunchTemplateId=template)
    assert [v["VersionNumber"] for v in left["LaunchTemplateVersions"]] == [1]  # the old group's own


def test_without_the_node_role_the_drain_role_cannot_replace_node_groups() -> None:
    policy = drain_role("prod-eks", "")
    held = {w.rpartition("/")[2] for w, _ in policy.grants()}
    assert held.isdisjoint(REPLACE_SIDS), held
    assert not {a for _, a in policy.grants()} & {
        "eks:CreateNodegroup",
        "eks:DeleteNodegroup",
        "iam:PassRole",
        "ec2:CreateLaunchTemplateVersion",
        "ec2:DeleteLaunchTemplateVersions",
    }
