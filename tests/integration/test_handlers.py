"""The Lambda handlers invoked with their ``events/`` files against real servers.

moto in server mode (DynamoDB state table from ``testing/dynamodb_table.py``, the EKS cluster and its
Auto Scaling groups from ``testing/moto_eks.py``, and the drain state machine created on moto's Step
Functions from ``infra/statemachine/drain.asl.json`` with its substitutions), the Kubernetes API double
over HTTP, and a real Prometheus holding DCGM series. Settings come from the environment exactly as the
template sets them (``RIGHTSIZER_*``), plus the test-only endpoint and kubeconfig overrides.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from rightsizer.adapters.aws import AwsClients
from rightsizer.cli import main
from rightsizer.services import observe as live
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
from rightsizer.wiring import clear_lambda_runtime, lambda_runtime, settings
from tests.builders import AT, STEP
from tests.integration.test_statemachine import LambdaContext, load_asl
from tests.support.planted_cluster import dcgm_families, seed_cluster, write_kubeconfig

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TABLE = "rightsizer-state"
POLICY = "max_nodes_per_run: 10\nmax_nodes_per_node_group: 10\ncooldown: 0s\n"


def families_at_tick_and_now() -> dict[str, list[Any]]:
    """The DCGM history of ``test_snapshot_cli`` twice: before the tick of ``events/assess-tick.json``
    (``AT``) and before the real now — drain steps take their time from the clock, not from an event."""
    shift = (int(time.time()) // STEP * STEP) - AT.timestamp()
    both: dict[str, list[Any]] = {}
    for metric, series in dcgm_families().items():
        for labels, samples in series:
            both.setdefault(metric, []).append((labels, [*samples, *((t + shift, v) for t, v in samples)]))
    return both


def handler(name: str) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """``functions/<name>/app.handler`` imported as Lambda does under ``CodeUri: functions/``."""
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    module = importlib.import_module(f"{name}.app")
    # Powertools binds its log stream at import: point it at this test's stdout (capsys), whichever test
    # imported the module first.
    module.logger.registered_handler.stream = sys.stdout
    fn: Callable[[dict[str, Any], Any], dict[str, Any]] = module.handler
    return fn


def event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / "events" / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


@dataclass
class Deployment:
    """What ``sam deploy`` would have created, on the local servers."""

    cluster: BuiltCluster
    double: KubernetesDouble
    state_machine_arn: str
    sfn: Any
    dynamodb: Any


@pytest.fixture
def deployment(
    tmp_path: Path,
    moto_server: MotoServer,
    aws_clients: AwsClients,
    gpu_cluster: BuiltCluster,
    prometheus_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Deployment]:
    session = boto3.session.Session(region_name="us-east-1")
    dynamodb = session.client("dynamodb", endpoint_url=moto_server.endpoint_url)
    create_state_table(dynamodb, TABLE)
    sfn = session.client("stepfunctions", endpoint_url=moto_server.endpoint_url)
    machine = sfn.create_state_machine(
        name="rightsizer-drain",
        definition=json.dumps(load_asl("arn:aws:lambda:us-east-1:123456789012:function:rightsizer-drain")),
        roleArn="arn:aws:iam::123456789012:role/rightsizer-drain-machine",
    )
    prometheus: PrometheusServer = prometheus_factory(families_at_tick_and_now())
    with KubernetesDouble(seed=7, resource_api_versions=None) as double:
        seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", double.base_url)
        # The template's environment …
        env = {
            "RIGHTSIZER_CLUSTER_NAME": gpu_cluster.cluster,
            "AWS_REGION": "us-east-1",
            "RIGHTSIZER_TABLE": TABLE,
            "RIGHTSIZER_DRY_RUN": "true",
            "RIGHTSIZER_PROMETHEUS_URL": prometheus.url,
            "RIGHTSIZER_PROMETHEUS_AUTH": "none",
            "RIGHTSIZER_PROMETHEUS_SECRET": "",
            "RIGHTSIZER_NODE_LABEL": "",
            "RIGHTSIZER_PRICING_API": "true",
            "RIGHTSIZER_POLICY_PARAMETER": "",
            "RIGHTSIZER_POLICY_INLINE": POLICY,
            "RIGHTSIZER_OFFHOURS": "{}",
            "RIGHTSIZER_STATE_MACHINE_ARN": machine["stateMachineArn"],
            "RIGHTSIZER_TRACING": "false",
            "POWERTOOLS_METRICS_NAMESPACE": "GPURightsizer",
            # … plus the test-only overrides: moto for every client, the double through a kubeconfig.
            "RIGHTSIZER_AWS_ENDPOINT_URL": moto_server.endpoint_url,
            "RIGHTSIZER_KUBE_CONTEXT": "double",
            "KUBECONFIG": str(kubeconfig),
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        clear_lambda_runtime()
        try:
            yield Deployment(gpu_cluster, double, machine["stateMachineArn"], sfn, dynamodb)
        finally:
            clear_lambda_runtime()


def executions(deployment: Deployment) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = deployment.sfn.list_executions(
        stateMachineArn=deployment.state_machine_arn
    )["executions"]
    return listed


def test_assess_tick_starts_one_named_drain_per_idle_node(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the scheduled tick of events/assess-tick.json (time comes from the event)
    tick = event("assess-tick")

    # WHEN the assess handler runs
    summary = handler("assess")(tick, LambdaContext(function_name="rightsizer-assess"))

    # THEN it planned at the tick's time and started one execution per idle node, named deterministically
    assert summary["at"] == tick["scheduled_time"]
    assert summary["verdicts"].get("idle", 0) >= 1, summary
    assert summary["dry_run"] is True
    started = sorted(summary["started"])
    assert len(started) == summary["verdicts"]["idle"]
    assert sorted(e["name"] for e in executions(deployment)) == started
    assert all(name.startswith("gpu-idle") for name in started)
    (first,) = [e for e in executions(deployment) if e["name"] == started[0]]
    described = deployment.sfn.describe_execution(executionArn=first["executionArn"])
    request = json.loads(described["input"])
    assert request["execution_id"] == started[0] and request["trigger"] == "schedule"
    # AND EMF metrics were printed in the GPURightsizer namespace
    out = capsys.readouterr().out
    emf = [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]
    names = {m["Name"] for doc in emf for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {"IdleNodes", "DrainsStarted", "AssessmentDuration", "PlannedSavingsUsdPerHour"} <= names
    assert {d["Namespace"] for doc in emf for d in doc["_aws"]["CloudWatchMetrics"]} == {"GPURightsizer"}
    # AND one decision log line per GPU node, with the same verdicts as the summary's counts
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    decisions = [line["decision"] for line in lines if line.get("message") == "decision"]
    assert sum(summary["verdicts"].values()) == len(decisions) == len({d["node"] for d in decisions})
    counted: dict[str, int] = {}
    for decision in decisions:
        counted[decision["verdict"]] = counted.get(decision["verdict"], 0) + 1
    assert counted == summary["verdicts"]
    drained = sorted(d["execution_id"] for d in decisions if d["action"] == "drain_started")
    assert drained == started
    assert all(d["why_not"] for d in decisions if d["action"] == "none")
    # AND the plan is kept in the state table for `rightsizer status`
    from rightsizer.adapters.dynamodb_plans import DynamoDbPlans

    (stored,) = DynamoDbPlans(deployment.dynamodb, TABLE, deployment.cluster.cluster).plans(limit=3)
    assert stored["records"] == decisions and stored["at"] == tick["scheduled_time"]


def test_a_retried_tick_does_not_start_a_drain_twice(deployment: Deployment) -> None:
    # GIVEN a tick that already ran
    tick = event("assess-tick")
    first = handler("assess")(tick, LambdaContext())

    # WHEN EventBridge Scheduler retries the same invocation (same execution id)
    second = handler("assess")(tick, LambdaContext())

    # THEN the same execution names come back and Step Functions holds no second execution
    assert sorted(second["started"]) == sorted(first["started"])
    assert len(executions(deployment)) == len(first["started"])


def test_drain_tasks_in_dry_run_validate_and_touch_nothing(deployment: Deployment) -> None:
    # GIVEN the drain task events of the state machine (Start, then Step), DryRun=true
    drain = handler("drain")
    node = event("drain-start")["request"]["node"]
    before = deployment.double.get_node(node)
    assert before is not None

    # WHEN the Start and one Step task run
    started = drain(event("drain-start"), LambdaContext())
    stepped = drain(event("drain-step"), LambdaContext())

    # THEN the record was created, validate ran on live data and ended the workflow as a dry run
    assert started["next_step"] == "validate" and started["status"] == "running"
    assert stepped["step"] == "validate" and stepped["next_step"] is None
    assert stepped["status"] == "dry_run", stepped
    assert "would cordon" in stepped["message"]
    # AND nothing was touched: the node is not cordoned, the group keeps its desired size
    after = deployment.double.get_node(node)
    assert after is not None and not after["spec"].get("unschedulable")
    asg = deployment.cluster.nodegroups["gpu-a10g"].asg_name
    groups = (
        boto3.session.Session(region_name="us-east-1")
        .client("autoscaling", endpoint_url=deployment.sfn.meta.endpoint_url)
        .describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"]
    )
    assert groups[0]["DesiredCapacity"] == 3

    # WHEN a late Rollback task arrives for the finished workflow
    rolled = drain(event("drain-rollback"), LambdaContext())

    # THEN it is a no-op that reports the recorded outcome
    assert rolled["status"] == "dry_run" and rolled["message"] == "already finished"


def test_drain_step_of_an_unknown_execution_fails_loudly(deployment: Deployment) -> None:
    with pytest.raises(KeyError):
        handler("drain")({"action": "step", "execution_id": "never-started"}, LambdaContext())


def test_offhours_tick_in_dry_run_reports_and_changes_nothing(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN node group gpu-l4 follows a nightly schedule that contains the tick of events/offhours-tick.json
    night = [
        {
            "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
            "start": "20:00",
            "end": "07:00",
            "timezone": "UTC",
        }
    ]
    monkeypatch.setenv(
        "RIGHTSIZER_OFFHOURS",
        json.dumps({"schedules": {"night": night}, "node_groups": [{"name": "gpu-l4", "schedule": "night"}]}),
    )
    clear_lambda_runtime()
    autoscaling = boto3.session.Session(region_name="us-east-1").client(
        "autoscaling", endpoint_url=deployment.sfn.meta.endpoint_url
    )
    asg = deployment.cluster.nodegroups["gpu-l4"].asg_name

    # WHEN the off-hours handler runs with DryRun=true
    report = handler("offhours")(event("offhours-tick"), LambdaContext(function_name="rightsizer-offhours"))

    # THEN it reports what it would do for the group, at the tick's time, and touched nothing
    assert report["dry_run"] is True
    assert report["at"] == event("offhours-tick")["scheduled_time"]
    (group,) = [g for g in report["groups"] if g["node_group"] == "gpu-l4"]
    assert group["schedule"] == "night"
    sizes = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
    assert (sizes["MinSize"], sizes["DesiredCapacity"]) == (0, 1)
    assert executions(deployment) == []


def test_alert_webhook_cold_start_from_the_template_environment_starts_a_named_execution(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    webhook = importlib.import_module("alert_webhook.app")
    monkeypatch.setenv("RIGHTSIZER_WEBHOOK_TOKEN", "s3cr3t-token")
    monkeypatch.delenv("RIGHTSIZER_CONFIG", raising=False)
    webhook.use_intake(None)
    try:
        firing = event("alert-webhook-firing")
        firing["headers"]["authorization"] = "Bearer s3cr3t-token"
        answer = webhook.lambda_handler(firing, LambdaContextStub())
        assert answer["statusCode"] == 202, answer
        started = json.loads(answer["body"])["started"]
        assert [e["name"] for e in executions(deployment)] == [s["execution_id"] for s in started]
        again = webhook.lambda_handler(firing, LambdaContextStub())
        assert again["statusCode"] == 200 and json.loads(again["body"])["duplicates"] == 1
        assert len(executions(deployment)) == 1
    finally:
        webhook.use_intake(None)


class LambdaContextStub:
    """The attributes Powertools reads from a Lambda context."""

    function_name = "rightsizer-alert-webhook"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:rightsizer-alert-webhook"
    aws_request_id = "0d7e1a8c-0000-4000-8000-000000000001"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 30_000


# ------------------------------------------------------------------------------------- composition root


def test_a_policy_change_in_ssm_reaches_the_warm_handler_after_max_age(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the policy in an SSM parameter, re-read after 60 s (the default), and a clock we can move
    # (frozen: under load the real clock alone can pass 10 s between the calls below)
    later = [0.0]
    base = settings.monotonic()
    monkeypatch.setattr(settings, "monotonic", lambda: base + later[0])
    ssm = boto3.session.Session(region_name="us-east-1").client(
        "ssm", endpoint_url=deployment.sfn.meta.endpoint_url
    )
    name = "/rightsizer/policy"
    ssm.put_parameter(Name=name, Type="String", Value=POLICY + "dry_run: false\n")
    monkeypatch.setenv("RIGHTSIZER_POLICY_PARAMETER", name)
    clear_lambda_runtime()
    assess = handler("assess")
    assert assess(event("assess-tick"), LambdaContext())["dry_run"] is False
    warm = lambda_runtime()

    # WHEN an operator flips the emergency switch in SSM
    ssm.put_parameter(Name=name, Type="String", Value=POLICY + "dry_run: true\n", Overwrite=True)

    # THEN within max_age the warm handler still uses the policy it read …
    later[0] = 50.0
    assert assess(event("assess-tick"), LambdaContext())["dry_run"] is False
    # … and after max_age the same warm runtime (no cold start, same clients) uses the new one
    later[0] = 61.0
    assert assess(event("assess-tick"), LambdaContext())["dry_run"] is True
    assert lambda_runtime() is warm
    assert warm.drain_workflow().deps.dry_run is True


def _count_observations(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """Record every live observation of the cluster (``services.observe.observe_live``) made from now on."""
    seen: list[datetime] = []
    real = live.observe_live

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(live, "observe_live", counting)
    return seen


OFFHOURS_A10G = {
    "schedules": {
        "always": [
            {
                "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
                "start": "00:00",
                "end": "23:59",
                "timezone": "UTC",
            }
        ]
    },
    "node_groups": [{"name": "gpu-a10g", "schedule": "always"}],
}


def test_one_observation_per_offhours_tick_on_the_lambda_path(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN node group gpu-a10g (three nodes) inside its off-hours schedule
    monkeypatch.setenv("RIGHTSIZER_OFFHOURS", json.dumps(OFFHOURS_A10G))
    clear_lambda_runtime()
    seen = _count_observations(monkeypatch)

    # WHEN one off-hours tick runs
    report = handler("offhours")(event("offhours-tick"), LambdaContext(function_name="rightsizer-offhours"))

    # THEN every node of the group was checked, on exactly one observation of the cluster
    (group,) = [g for g in report["groups"] if g["node_group"] == "gpu-a10g"]
    assert len(group["node_reasons"]) + len(group["actions"]) >= 2, group
    assert len(seen) == 1


def test_one_observation_per_offhours_tick_on_the_cli_path(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # GIVEN the same deployment as a config file for the CLI
    config = {
        "cluster": {"name": deployment.cluster.cluster, "region": "us-east-1", "context": "double"},
        "prometheus": {"url": os.environ["RIGHTSIZER_PROMETHEUS_URL"]},
        "aws": {"region": "us-east-1", "endpoint_url": deployment.sfn.meta.endpoint_url, "table": TABLE},
        "policy": {"max_nodes_per_run": 10, "max_nodes_per_node_group": 10, "cooldown": "0s"},
        "offhours": OFFHOURS_A10G,
    }
    config["cluster"]["kubeconfig"] = os.environ["KUBECONFIG"]
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    seen = _count_observations(monkeypatch)

    # WHEN `rightsizer offhours down` evaluates one tick (dry run)
    code = main(["offhours", "down", "--config", str(path), "--at", event("offhours-tick")["scheduled_time"]])

    # THEN it observed the cluster exactly once for the whole group
    assert code == 0
    assert len(seen) == 1


def test_offhours_starts_no_drain_of_a_snoozed_or_backed_off_node(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN node group gpu-a10g inside its off-hours schedule at the assess tick (fresh DCGM series), its
    # busy node gone: the two idle members gpu-idle and gpu-idle-2 are what a scale-down would drain
    from rightsizer.adapters.dynamodb_approvals import DynamoDbApprovals
    from rightsizer.adapters.dynamodb_state import DynamoDbState
    from rightsizer.state import LedgerEntry

    monkeypatch.setenv("RIGHTSIZER_OFFHOURS", json.dumps(OFFHOURS_A10G))
    clear_lambda_runtime()
    # (its pods stay bound to it: a controller recreating the trainer would place it on an idle node)
    assert deployment.double.delete_node("gpu-busy", delete_pods=False)
    tick = event("assess-tick")
    at = datetime.fromisoformat(tick["scheduled_time"])
    cluster = deployment.cluster.cluster
    approvals = DynamoDbApprovals(deployment.dynamodb, TABLE, cluster)
    ledger = DynamoDbState(deployment.dynamodb, TABLE, cluster)

    def failed_drain(node: str, ago: timedelta) -> None:
        ledger.record(
            LedgerEntry(f"drain-{node}-{ago.seconds}", node, None, "gpu-a10g", "scale_in", "rollback",
                        "rolled_back", "eviction_timeout", None, None, at - ago)
        )  # fmt: skip

    # AND holds that have ended: a snooze until 1 s before the tick, a drain that failed 2 h before it
    approvals.snooze("gpu-idle", at - timedelta(seconds=1), by="cli:ops", now=at - timedelta(hours=8))
    failed_drain("gpu-idle-2", timedelta(hours=2))

    # WHEN the off-hours handler runs (dry run)
    report = handler("offhours")({**tick}, LambdaContext(function_name="rightsizer-offhours"))

    # THEN it would drain both members: nothing else holds them
    (group,) = [g for g in report["groups"] if g["node_group"] == "gpu-a10g"]
    assert group["requested"][-1]["action"] == "drain_then_scale_down", group
    assert group["requested"][-1]["drain"] == ["gpu-idle", "gpu-idle-2"]

    # GIVEN now a running snooze of gpu-idle (until 8 h after the tick) and a drain of gpu-idle-2 that
    # rolled back 1 min before it (default back-off 30 min), and the functions acting (dry run off)
    approvals.snooze("gpu-idle", at + timedelta(hours=8), by="cli:ops", now=at - timedelta(minutes=5))
    failed_drain("gpu-idle-2", timedelta(minutes=1))
    monkeypatch.setenv("RIGHTSIZER_DRY_RUN", "false")
    monkeypatch.setenv("RIGHTSIZER_POLICY_INLINE", POLICY + "dry_run: false\n")
    clear_lambda_runtime()

    # WHEN the off-hours handler runs again
    report = handler("offhours")({**tick}, LambdaContext(function_name="rightsizer-offhours"))

    # THEN it skips the group, naming each hold as the planner and the assessment do, and starts nothing
    assert report["dry_run"] is False
    (group,) = [g for g in report["groups"] if g["node_group"] == "gpu-a10g"]
    assert group["outcome"] == "skipped", group
    assert group["node_reasons"] == {
        "gpu-idle": ["verdict:protected", "snoozed:until:2026-11-02T18:00:00Z"],
        "gpu-idle-2": ["verdict:idle", "drain_failure_backoff:until:2026-11-02T10:29:00Z:rolled_back"],
    }
    assert group["actions"] == [] and group["drains"] == []
    assert executions(deployment) == []
    autoscaling = boto3.session.Session(region_name="us-east-1").client(
        "autoscaling", endpoint_url=deployment.sfn.meta.endpoint_url
    )
    asg = deployment.cluster.nodegroups["gpu-a10g"].asg_name
    sizes = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
    assert (sizes["MinSize"], sizes["DesiredCapacity"]) == (1, 3)
