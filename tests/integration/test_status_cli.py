"""``rightsizer status`` / ``history`` against a deployed stack on moto (server mode).

The stack is a CloudFormation stack on moto with the template's outputs (``ClusterName``,
``StateTableName``) and the ``OffhoursConfig`` parameter; the state table is filled the way the
functions fill it: a scheduled assessment (``run_assessment`` with the DynamoDB plan store) writes the
decision records, drains and off-hours write the ledger, a slot and a workflow record stand for a drain in
flight, and an off-hours scale-down saved its sizes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.dynamodb_plans import DynamoDbPlans
from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.cli import main
from rightsizer.domain.model import GroupSizes
from rightsizer.domain.policy import Policy
from rightsizer.services.assess import AssessmentDeps, run_assessment
from rightsizer.state import LedgerEntry, Slot, WorkflowRecord
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter
from rightsizer.testing.moto_eks import MotoServer
from tests.builders import AT, const, gpu_node, merge_metrics, node_devices, pod, snapshot

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

CLUSTER = "prod-eks"
TABLE = "rightsizer-state-ABC123"  # a generated name: the user never types it
STACK = "gpu-rightsizer"
STACK_TEMPLATE = {
    "Parameters": {"OffhoursConfig": {"Type": "String", "Default": "{}"}},
    "Resources": {"AlarmTopic": {"Type": "AWS::SNS::Topic"}},
    "Outputs": {
        "ClusterName": {"Value": CLUSTER},
        "StateTableName": {"Value": TABLE},
    },
}
OFFHOURS = {
    "schedules": {"nights": [{"days": ["Mon"], "start": "20:00", "end": "07:00", "timezone": "UTC"}]},
    "node_groups": [{"name": "gpu-dev", "schedule": "nights"}],
}


class Starter:
    def start(self, request: Any) -> str:
        return str(request.execution_id)


@pytest.fixture
def deployed(
    moto_server: MotoServer, aws_clients: AwsClients, monkeypatch: pytest.MonkeyPatch
) -> DynamoDbState:
    """A stack with its outputs, and a state table holding one assessment, a drain in flight, saved
    off-hours sizes, an applied removal yesterday and a rolled-back drain."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint_url)  # every boto3 client of the CLI
    boto = boto3.session.Session(region_name="us-east-1")
    boto.client("cloudformation").create_stack(
        StackName=STACK,
        TemplateBody=json.dumps(STACK_TEMPLATE),
        Parameters=[{"ParameterKey": "OffhoursConfig", "ParameterValue": json.dumps(OFFHOURS)}],
    )
    dynamodb = boto.client("dynamodb")
    create_state_table(dynamodb, TABLE)
    state = DynamoDbState(dynamodb, TABLE, CLUSTER)
    now = datetime.now(UTC).replace(microsecond=0)
    nodes = [
        gpu_node("idle-1", instance_type="g5.12xlarge", gpus=4, instance_id="i-idle1"),
        gpu_node("busy-1", instance_type="g5.12xlarge", gpus=4, instance_id="i-busy1"),
    ]
    metrics = merge_metrics(
        node_devices("idle-1", 4), node_devices("busy-1", 4, util=const(95), fb_used=const(20000))
    )
    run_assessment(
        AssessmentDeps(
            cluster_name=CLUSTER,
            observe=lambda at: snapshot(nodes, [pod("vllm-0", "busy-1", gpus=4)], metrics, at=AT),
            policy=Policy(),
            cluster=FakeClusterWriter(clock=FakeClock(now)),
            state=state,
            starter=Starter(),
            plans=DynamoDbPlans(dynamodb, TABLE, CLUSTER),
        ),
        AT,  # the builders' series end at AT
        "tick-1",
    )
    yesterday = now - timedelta(days=1)
    state.record(
        LedgerEntry("drain-a", "idle-0", "i-0", "gpu-a10g", "scale_in", "remove", "applied", "",
                    5.672, 4140.56, yesterday)
    )  # fmt: skip
    state.record(
        LedgerEntry("drain-b", "idle-2", "i-2", "gpu-a10g", "scale_in", "rollback", "rolled_back",
                    "drain_timeout:pods_left:db/db-0", None, None, now - timedelta(minutes=20))
    )  # fmt: skip
    slot = state.take_slot(
        "gpu-a10g", "idle-1", "drain-c", now, max_per_run=1, max_per_group=1, desired=3, min_size=1
    )
    assert isinstance(slot, Slot)
    state.save(
        WorkflowRecord("drain-c", "idle-1", "i-idle1", "evict", "running", now, now + timedelta(minutes=10)),
        0,
    )
    state.save_sizes("gpu-dev", GroupSizes(min=1, desired=2, max=4), now - timedelta(hours=2))
    return state


def test_status_from_the_stack_name_alone_shows_every_part(
    deployed: DynamoDbState, capsys: pytest.CaptureFixture[str]
) -> None:
    # WHEN a user asks for the status of the stack, by name only
    assert main(["status", "--stack", STACK, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    # THEN the latest assessment's decision records are there, one per GPU node, with verdicts and reasons
    assert report["cluster"] == CLUSTER
    records = {r["node"]: r for r in report["plan"]["records"]}
    assert set(records) == {"idle-1", "busy-1"}
    assert records["idle-1"]["verdict"] == "idle" and records["idle-1"]["action"] == "drain_started"
    assert records["busy-1"]["verdict"] == "busy" and records["busy-1"]["action"] == "none"
    assert records["busy-1"]["why_not"].startswith("busy: activity_above_threshold")
    # AND the drain in flight with its step, the saved off-hours sizes, savings and the failure
    assert report["in_flight"] == [
        {
            "node": "idle-1",
            "node_group": "gpu-a10g",
            "execution_id": "drain-c",
            "since": report["in_flight"][0]["since"],
            "step": "evict",
            "status": "running",
            "deadline": report["in_flight"][0]["deadline"],
        }
    ]
    (group,) = report["offhours"]
    assert (group["node_group"], group["saved"]) == ("gpu-dev", {"min": 1, "desired": 2, "max": 4})
    by_kind = report["savings"]["by_action_kind"]
    assert by_kind == [{"kind": "scale_in", "applied": 1, "hourly_usd": 5.672}]
    hours = sum(r["instance_hours"] for r in report["savings"]["by_day_and_node_group"])
    assert 23.9 < hours < 24.1  # removed a day ago, nothing restored since
    assert report["savings"]["total_usd"] == pytest.approx(hours * 5.672, rel=1e-6)
    (failure,) = report["failures"]
    assert (failure["node"], failure["result"]) == ("idle-2", "rolled_back")


def test_status_text_prints_the_plan_table_and_history_the_ledger(
    deployed: DynamoDbState, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--stack", STACK]) == 0
    text = capsys.readouterr().out
    assert "idle-1" in text and "drain_started" in text and "busy: activity_above_threshold" in text
    assert "step evict" in text and "gpu-dev: min 1 / desired 2 / max 4" in text
    assert "rolled_back: drain_timeout:pods_left:db/db-0" in text

    assert main(["history", "--stack", STACK, "--json", "--node", "idle-0"]) == 0
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert [(r["node"], r["step"], r["result"], r["hourly_savings_usd"]) for r in rows] == [
        ("idle-0", "remove", "applied", 5.672)
    ]
    assert main(["history", "--stack", STACK]) == 0
    assert "drain-b" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["status", "--stack", "no-such-stack"], "stack 'no-such-stack' not found"),
        (["status"], "one of the arguments --stack --config is required"),
    ],
)
def test_a_wrong_stack_is_a_clear_error(
    deployed: DynamoDbState, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    try:
        code = main(argv)
    except SystemExit as usage:  # argparse: a usage error
        code = int(usage.code or 0)
    assert code == 2
    assert needle in capsys.readouterr().err
