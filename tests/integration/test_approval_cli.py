"""``rightsizer approve|reject|snooze`` against a deployed stack on moto (server mode), with the
operator's credentials: the decision is the same conditional write the links make, then Step Functions
is woken (SendTaskSuccess / SendTaskFailure with the stored task token)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import boto3
import botocore.client
import pytest

from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.dynamodb_approvals import DynamoDbApprovals
from rightsizer.cli import main
from rightsizer.state import ApprovalRequest
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.moto_eks import MotoServer

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

CLUSTER, TABLE, STACK = "prod-eks", "rightsizer-state-XYZ", "gpu-rightsizer"
TEMPLATE = {
    "Resources": {"AlarmTopic": {"Type": "AWS::SNS::Topic"}},
    "Outputs": {"ClusterName": {"Value": CLUSTER}, "StateTableName": {"Value": TABLE}},
}


@contextmanager
def recording() -> Iterator[SimpleNamespace]:
    """Every AWS call made in the block, as ``calls`` of (``<service>:<Operation>``, params)."""
    seen = SimpleNamespace(calls=[])
    original = botocore.client.BaseClient._make_api_call

    def call(client: Any, operation: str, params: Any) -> Any:
        action = f"{client.meta.service_model.signing_name}:{operation}"
        seen.calls.append(SimpleNamespace(action=action, params=dict(params)))
        return original(client, operation, params)

    with patch.object(botocore.client.BaseClient, "_make_api_call", call):
        yield seen


@pytest.fixture
def approvals(
    moto_server: MotoServer, aws_clients: AwsClients, monkeypatch: pytest.MonkeyPatch
) -> DynamoDbApprovals:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint_url)
    boto = boto3.session.Session(region_name="us-east-1")
    boto.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(TEMPLATE))
    dynamodb = boto.client("dynamodb")
    create_state_table(dynamodb, TABLE)
    store = DynamoDbApprovals(dynamodb, TABLE, CLUSTER)
    now = datetime.now(UTC)
    for execution, node in (("gpu-1-exec", "gpu-1"), ("gpu-2-exec", "gpu-2")):
        store.open_approval(
            ApprovalRequest(
                execution, node, f"nonce-{node}", now, now + timedelta(hours=1), task_token=f"token-{node}"
            )
        )
    return store


def test_approve_from_the_cli_decides_once_and_wakes_the_drain(
    approvals: DynamoDbApprovals, capsys: pytest.CaptureFixture[str]
) -> None:
    with recording() as recorder:
        assert main(["approve", "gpu-1-exec", "--stack", STACK]) == 0
    assert capsys.readouterr().out.startswith("gpu-1-exec: approved (node gpu-1)")
    stored = approvals.get_approval("gpu-1-exec")
    assert stored is not None and stored.status == "approved" and (stored.decided_by or "").startswith("cli:")
    woken = [c for c in recorder.calls if c.action.startswith("states:")]
    assert [(c.action, c.params["taskToken"]) for c in woken] == [("states:SendTaskSuccess", "token-gpu-1")]
    # a second decision changes nothing: exit 1, and the request stays approved
    assert main(["reject", "gpu-1-exec", "--stack", STACK, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["outcome"] == "already_approved"
    assert approvals.get_approval("gpu-1-exec").status == "approved"  # type: ignore[union-attr]


def test_snooze_from_the_cli_rejects_and_records_the_snooze(
    approvals: DynamoDbApprovals, capsys: pytest.CaptureFixture[str]
) -> None:
    before = datetime.now(UTC)
    with recording() as recorder:
        assert main(["snooze", "gpu-2-exec", "--for", "2h", "--stack", STACK, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["outcome"], document["node"]) == ("snoozed", "gpu-2")
    until = approvals.snoozes(before)["gpu-2"]
    assert timedelta(hours=2) <= until - before < timedelta(hours=2, minutes=1)
    assert not approvals.snoozes(before + timedelta(hours=2, minutes=1))
    [failure] = [c for c in recorder.calls if c.action.startswith("states:")]
    assert (failure.action, failure.params["error"]) == ("states:SendTaskFailure", "ApprovalSnoozed")


def test_unknown_execution_and_bad_duration_are_bad_input(
    approvals: DynamoDbApprovals, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["approve", "no-such-exec", "--stack", STACK]) == 2
    assert main(["snooze", "gpu-2-exec", "--for", "soon", "--stack", STACK]) == 2
    assert "--for" in capsys.readouterr().err
    assert approvals.get_approval("gpu-2-exec").status == "pending"  # type: ignore[union-attr]


@pytest.mark.parametrize("duration", ["31d", "721h", "8760000h", "99999999999999h", "9" * 400 + "h", "0s"])
def test_a_snooze_past_the_cap_is_bad_input_naming_the_cap_and_changes_nothing(
    approvals: DynamoDbApprovals, capsys: pytest.CaptureFixture[str], duration: str
) -> None:
    # Issue 26: --for 8760000h was accepted (snoozed to the year 3026), 99999999999999h crashed with an
    # OverflowError traceback. The cap is the policy's: a snooze lasts at most 30 days.
    with recording() as recorder:
        code = main(["snooze", "gpu-2-exec", "--for", duration, "--stack", STACK])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "--for" in err, err
    assert "30d" in err or "3650d" in err, err
    assert approvals.get_approval("gpu-2-exec").status == "pending"  # type: ignore[union-attr]
    assert not approvals.snoozes(datetime.now(UTC))
    assert not [c for c in recorder.calls if c.action.startswith(("states:", "dynamodb:Update"))]


def test_the_decider_is_the_callers_aws_principal_never_user(
    approvals: DynamoDbApprovals, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a caller who says they are someone else
    monkeypatch.setenv("USER", "anyone")
    monkeypatch.setenv("LOGNAME", "anyone")
    arn = boto3.session.Session(region_name="us-east-1").client("sts").get_caller_identity()["Arn"]

    # WHEN they decide from the CLI
    with recording() as recorder:
        assert main(["reject", "gpu-1-exec", "--stack", STACK]) == 0

    # THEN the request records the principal STS authenticated, and asked STS before deciding
    stored = approvals.get_approval("gpu-1-exec")
    assert stored is not None and stored.decided_by == f"cli:{arn}"
    assert "anyone" not in (stored.decided_by or "")
    actions = [c.action for c in recorder.calls]
    assert actions.index("sts:GetCallerIdentity") < actions.index("dynamodb:UpdateItem"), actions


def test_snooze_without_for_lasts_the_deployed_policys_approval_snooze(
    approvals: DynamoDbApprovals, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a stack deployed with PolicyInline approval_snooze: 3h (not the 24 h default)
    boto = boto3.session.Session(region_name="us-east-1")
    template = {
        **TEMPLATE,
        "Parameters": {
            "PolicyParameterName": {"Type": "String", "Default": ""},
            "PolicyInline": {"Type": "String", "Default": "{}"},
        },
    }
    boto.client("cloudformation").create_stack(
        StackName="gpu-rightsizer-3h",
        TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": "PolicyInline", "ParameterValue": "approval_snooze: 3h"}],
    )
    before = datetime.now(UTC)
    # WHEN the operator snoozes without --for
    assert main(["snooze", "gpu-2-exec", "--stack", "gpu-rightsizer-3h", "--json"]) == 0
    # THEN the node is snoozed for the deployed policy's 3 h
    assert json.loads(capsys.readouterr().out)["outcome"] == "snoozed"
    until = approvals.snoozes(before)["gpu-2"]
    assert timedelta(hours=3) <= until - before < timedelta(hours=3, minutes=1)


def test_the_region_comes_from_the_stack_arn(
    approvals: DynamoDbApprovals, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no region in the environment, only the stack's ARN
    arn = (
        boto3.session.Session(region_name="us-east-1")
        .client("cloudformation")
        .describe_stacks(StackName=STACK)["Stacks"][0]["StackId"]
    )
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    # WHEN status reads the stack by ARN
    assert main(["status", "--stack", arn, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)
    # AND a --region contradicting the ARN is a usage error naming the fix
    assert main(["status", "--stack", arn, "--region", "eu-west-1"]) == 2
    assert "is not the stack ARN's region us-east-1: drop --region" in capsys.readouterr().err
