"""The sharded assessment end to end (issue 33 item 3): the assess handler hands a cluster over
``RIGHTSIZER_SHARD_ABOVE_GPU_NODES`` to the shard state machine (on moto's Step Functions), and
``infra/statemachine/shard.asl.json`` runs with the real ``assess/shard`` handlers (the project's ASL
interpreter: the Distributed Map's ItemReader and ResultWriter on moto S3) against the Kubernetes double and
a real Prometheus. Cut into three shards, the cluster gets the plan the unsharded assessment made.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import boto3
import pytest

from rightsizer.adapters.dynamodb_plans import DynamoDbPlans
from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.services.shard import RUN_LOCK
from rightsizer.testing.fakes import FakeClock
from rightsizer.wiring import clear_lambda_runtime
from tests.builders import AT
from tests.integration.test_handlers import ROOT, TABLE, Deployment, deployment, event, handler
from tests.integration.test_statemachine import LambdaContext
from tests.support.asl import AslInterpreter

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

__all__ = ["deployment"]  # the fixture, re-used from test_handlers

BUCKET = "rightsizer-shards"
ARNS = {
    name: f"arn:aws:lambda:us-east-1:123456789012:function:rightsizer-shard-{name}"
    for name in ("prepare", "observe", "merge", "release")
}


def definition() -> dict[str, Any]:
    """The shard ASL with the template's substitutions."""
    text = (ROOT / "infra/statemachine/shard.asl.json").read_text(encoding="utf-8")
    for name, arn in ARNS.items():
        text = text.replace(f"${{Shard{name.capitalize()}FunctionArn}}", arn)
    loaded: dict[str, Any] = json.loads(text.replace("${ShardBucketName}", BUCKET))
    return loaded


def machine(endpoint_url: str) -> tuple[AslInterpreter, list[tuple[str, dict[str, Any]]]]:
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    app = importlib.import_module("assess.shard")
    app.logger.registered_handler.stream = sys.stdout
    handlers = {ARNS[n]: getattr(app, n) for n in ARNS}
    calls: list[tuple[str, dict[str, Any]]] = []

    def invoke(arn: str, payload: dict[str, Any]) -> Any:
        calls.append((arn.rsplit("-", 1)[1], payload))
        return handlers[arn](payload, LambdaContext(function_name=arn.rsplit(":", 1)[1]))

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint_url)
    return AslInterpreter(definition(), invoke, FakeClock(AT), s3=s3, max_transitions=10_000), calls


def _comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decision records without the drain execution ids (named from the tick id, which differs)."""
    return [{k: v for k, v in r.items() if k != "execution_id"} for r in records]


def test_a_cluster_cut_into_three_shards_gets_the_unsharded_plan(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = str(deployment.sfn.meta.endpoint_url)
    plans = DynamoDbPlans(deployment.dynamodb, TABLE, deployment.cluster.cluster)
    tick = event("assess-tick")
    # GIVEN the unsharded assessment's plan of the cluster at the tick
    unsharded = handler("assess")(tick, LambdaContext(function_name="rightsizer-assess"))
    (whole,) = plans.plans(limit=1)
    assert unsharded["verdicts"] == {"idle": 2, "underutilized": 1} and len(unsharded["started"]) == 2

    # AND the stack deployed with EnableSharding, sharding above 2 GPU nodes, one GPU node per shard
    boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    shard_machine = deployment.sfn.create_state_machine(
        name="rightsizer-assess-shards",
        definition=json.dumps(definition()),
        roleArn="arn:aws:iam::123456789012:role/rightsizer-shards-machine",
    )["stateMachineArn"]
    for key, value in {
        "RIGHTSIZER_SHARD_STATE_MACHINE_ARN": shard_machine,
        "RIGHTSIZER_SHARD_ABOVE_GPU_NODES": "2",
        "RIGHTSIZER_SHARD_BUCKET": BUCKET,
        "RIGHTSIZER_SHARD_GPU_NODES_PER_SHARD": "1",
        "RIGHTSIZER_SHARD_MAX_CONCURRENCY": "2",
    }.items():
        monkeypatch.setenv(key, value)
    clear_lambda_runtime()

    # WHEN the scheduled tick comes (and is retried): the assess handler hands the cluster over, once
    handed = handler("assess")(tick, LambdaContext(function_name="rightsizer-assess"))
    again = handler("assess")(tick, LambdaContext(function_name="rightsizer-assess"))
    run = handed["sharded"]
    assert again == handed and run == f"assess-{tick['execution_id']}"[:80]
    (started,) = deployment.sfn.list_executions(stateMachineArn=shard_machine)["executions"]
    described = deployment.sfn.describe_execution(executionArn=started["executionArn"])
    assert started["name"] == run and json.loads(described["input"])["gpu_nodes"] == 3

    # AND Step Functions runs it: prepare, one Map child per shard, merge
    interpreter, calls = machine(endpoint)
    before = len(deployment.double.requests)
    execution = interpreter.run(json.loads(described["input"]), run)

    # THEN the run succeeded with three shards of one node each
    assert execution.status == "SUCCEEDED", (execution.error, execution.cause)
    (map_run,) = interpreter.map_runs
    assert (map_run.items, map_run.succeeded, map_run.failed) == (3, 3, 0)
    observed = [p for kind, p in calls if kind == "observe"]
    assert sorted(len(p["shard"]["nodes"]) for p in observed) == [1, 1, 1]
    # AND each shard listed only its own node's pods (fieldSelector=spec.nodeName=<node>)
    pod_lists = [
        r for r in deployment.double.requests[before:] if r.method == "GET" and r.path == "/api/v1/pods"
    ]
    selectors = sorted(r.query.get("fieldSelector", [""])[0] for r in pod_lists)
    assert selectors == sorted(
        ["spec.nodeName="] + [f"spec.nodeName={p['shard']['nodes'][0]}" for p in observed]
    )
    # AND the merged plan is the unsharded one: the same verdicts, reasons and actions for every node
    summary = execution.output["assessment"]
    assert summary["verdicts"] == unsharded["verdicts"]
    assert len(summary["started"]) == len(unsharded["started"])
    (sharded,) = plans.plans(limit=1)  # the plan of the same instant, kept in its place
    assert _comparable(sharded["records"]) == _comparable(whole["records"])
    assert {r["node"] for r in sharded["records"] if r["action"] == "drain_started"} == {
        "gpu-idle",
        "gpu-idle-2",
    }
    # AND the drains it started are named from the run, so a retried merge could not start them twice
    names = {
        e["name"]
        for e in deployment.sfn.list_executions(stateMachineArn=deployment.state_machine_arn)["executions"]
    }
    assert set(summary["started"]) <= names and not set(summary["started"]) & set(unsharded["started"])
    # AND the run lock was given back
    state = DynamoDbState(deployment.dynamodb, TABLE, deployment.cluster.cluster)
    assert state.get(RUN_LOCK) is None


def _one_node_shards(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> str:
    """The shard bucket on moto and shards of one GPU node each; returns moto's endpoint URL."""
    endpoint = str(deployment.sfn.meta.endpoint_url)
    boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("RIGHTSIZER_SHARD_BUCKET", BUCKET)
    monkeypatch.setenv("RIGHTSIZER_SHARD_GPU_NODES_PER_SHARD", "1")
    clear_lambda_runtime()
    return endpoint


def test_a_run_while_another_holds_the_lock_assesses_nothing(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _one_node_shards(deployment, monkeypatch)
    state = DynamoDbState(deployment.dynamodb, TABLE, deployment.cluster.cluster)
    assert state.acquire(RUN_LOCK, "assess-earlier", AT, 3600) is not None
    interpreter, calls = machine(endpoint)

    execution = interpreter.run({"at": event("assess-tick")["scheduled_time"]}, "assess-later")

    assert execution.status == "SUCCEEDED" and execution.states[-1] == "SkippedLocked"
    assert [kind for kind, _ in calls] == ["prepare"]
    assert interpreter.map_runs == []
    held = state.get(RUN_LOCK)
    assert held is not None and held.owner == "assess-earlier"


def test_a_failed_shard_fails_the_run_gives_the_lock_back_and_decides_nothing(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _one_node_shards(deployment, monkeypatch)
    plans = DynamoDbPlans(deployment.dynamodb, TABLE, deployment.cluster.cluster)
    # GIVEN one shard whose reads keep failing (its node's pod list, every attempt)
    import rightsizer.services.shard as service

    real = service.pods_on

    def failing(reader: Any, nodes: Any) -> Any:
        if "gpu-busy" in nodes:
            raise RuntimeError("the API server timed out listing the pods of gpu-busy")
        return real(reader, nodes)

    monkeypatch.setattr(service, "pods_on", failing)
    interpreter, calls = machine(endpoint)

    # WHEN the run goes
    execution = interpreter.run({"at": event("assess-tick")["scheduled_time"]}, "assess-broken")

    # THEN it fails as a whole after the shard's retries: no merge, no plan, no drain
    assert (execution.status, execution.error) == ("FAILED", "ShardedAssessmentFailed")
    kinds = [kind for kind, _ in calls]
    assert "merge" not in kinds and kinds[-1] == "release"
    assert kinds.count("observe") == 3 + 2  # three shards, the broken one retried twice (States.TaskFailed)
    assert plans.plans(limit=1) == []
    assert deployment.sfn.list_executions(stateMachineArn=deployment.state_machine_arn)["executions"] == []
    # AND the lock is free for the next tick
    state = DynamoDbState(deployment.dynamodb, TABLE, deployment.cluster.cluster)
    assert state.get(RUN_LOCK) is None
