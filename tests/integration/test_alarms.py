"""Loud failures: every alarm of ``template.yaml`` fires on the failure it is for.

Each failure is injected into the real handler (the drain handler driven by the state machine definition
through the ASL interpreter, the off-hours and assess handlers over in-memory ports), the EMF documents
the handler prints are read back, and the metric each alarm watches must be there with exactly the
alarm's namespace, dimensions and a value that crosses its threshold. The dashboard's CloudWatch panels
are held to the same documents (metric names and dimensions the handlers really emit).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from rightsizer.adapters.memory_state import MemoryPlans, MemoryState
from rightsizer.domain.errors import MetricsFailed, PermanentError, TransientError
from rightsizer.domain.policy import Policy
from rightsizer.ports import EvictionOutcome
from rightsizer.services.assess import AssessmentDeps
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter
from tests.builders import AT, gpu_node, merge_metrics, node_devices, pdb, pod, snapshot
from tests.integration.test_statemachine import NODE, LambdaContext, World, drain_world, request
from tests.unit.test_template import CfnLoader

pytestmark = pytest.mark.integration


@pytest.fixture
def world() -> Iterator[World]:
    with drain_world() as made:
        yield made


ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "prod-eks"  # the cluster of the state machine world (MemoryState("prod-eks"))

Emitted = tuple[str, str, dict[str, str], float]  # namespace, metric, dimensions, value


def template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((ROOT / "template.yaml").read_text(encoding="utf-8"), Loader=CfnLoader)
    return loaded


def alarms() -> dict[str, dict[str, Any]]:
    return {
        n: r["Properties"]
        for n, r in template()["Resources"].items()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    }


def emf(out: str) -> list[Emitted]:
    """Every (namespace, metric, dimensions, value) of the EMF documents printed on stdout."""
    found: list[Emitted] = []
    for line in out.splitlines():
        if not line.startswith('{"_aws"'):
            continue
        doc = json.loads(line)
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for dims in directive["Dimensions"]:
                values = {d: str(doc[d]) for d in dims}
                for metric in directive["Metrics"]:
                    raw = doc[metric["Name"]]
                    for value in raw if isinstance(raw, list) else [raw]:
                        found.append((directive["Namespace"], metric["Name"], values, float(value)))
    return found


def fires(alarm: dict[str, Any], emitted: Iterable[Emitted], cluster: str = CLUSTER) -> bool:
    """True when ``emitted`` holds the alarm's metric with exactly its dimensions, crossing its threshold."""
    want = {
        d["Name"]: cluster if d["Value"] == {"Ref": "ClusterName"} else d["Value"]
        for d in alarm["Dimensions"]
    }
    values = [
        v
        for ns, name, dims, v in emitted
        if (ns, name, dims) == (alarm["Namespace"], alarm["MetricName"], want)
    ]
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    return (
        bool(values)
        and (max(values) if alarm["Statistic"] == "Maximum" else sum(values)) >= alarm["Threshold"]
    )


def own_metric_alarms() -> dict[str, dict[str, Any]]:
    return {n: a for n, a in alarms().items() if a.get("Namespace") == "GPURightsizer"}


# ------------------------------------------------------------------------------------------ drains


def blocked_until_deadline(world: World) -> None:
    world.cluster.add_pod(pod("db-0", NODE, namespace="db", grace=30, labels={"app": "db"}))
    world.cluster.add_pdb(pdb("db", "db", {"app": "db"}, allowed=1))
    blocked = EvictionOutcome("blocked", "Cannot evict pod as it would violate the pod's disruption budget.")
    world.cluster.script_eviction("db", "db-0", *[blocked] * 1000)


def test_a_rolled_back_drain_fires_drains_rolled_back_only(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a drain whose eviction stays blocked past its deadline
    blocked_until_deadline(world)
    capsys.readouterr()

    # WHEN the state machine runs it
    run = world.interpreter.run(request(), "rolled-back")

    # THEN it rolled back, and exactly the rolled-back alarm's metric crossed its threshold
    assert run.error == "DrainFailed"
    emitted = emf(capsys.readouterr().out)
    fired = {name for name, alarm in own_metric_alarms().items() if fires(alarm, emitted)}
    assert fired == {"DrainsRolledBackAlarm"}


def test_a_failed_drain_fires_drains_failed(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the Auto Scaling API keeps throttling longer than the state machine's Retry budget
    for _ in range(20):
        world.scaler.fail_next("find_group", TransientError("Throttling", retry_after=1))
    capsys.readouterr()

    # WHEN the state machine runs the drain (Catch → Rollback with the error)
    run = world.interpreter.run(request(), "throttled")

    # THEN the drain failed and the failed-drain alarm's metric crossed its threshold
    assert run.error == "DrainFailed"
    emitted = emf(capsys.readouterr().out)
    fired = {name for name, alarm in own_metric_alarms().items() if fires(alarm, emitted)}
    assert fired == {"DrainsFailedAlarm"}


def test_a_rollback_that_cannot_uncordon_fires_rollback_failed(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a drain that will roll back, and an API server that refuses the uncordon
    blocked_until_deadline(world)

    def refuse(node: str, execution_id: str) -> bool:
        raise PermanentError("403 Forbidden: patch nodes")

    monkeypatch.setattr(world.cluster, "uncordon", refuse)
    capsys.readouterr()

    # WHEN the state machine runs it
    run = world.interpreter.run(request(), "uncordon-refused")

    # THEN the node may still be cordoned: the rollback-failed alarm fires (and the drain counts as failed)
    assert run.error == "DrainFailed"
    emitted = emf(capsys.readouterr().out)
    fired = {name for name, alarm in own_metric_alarms().items() if fires(alarm, emitted)}
    assert fired == {"RollbackFailedAlarm", "DrainsFailedAlarm"}


def test_a_rollback_task_that_raises_fires_rollback_failed(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a drain that will roll back, and a rollback that itself crashes (e.g. the state table is gone)
    blocked_until_deadline(world)

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("state table unreachable")

    monkeypatch.setattr(world.workflow, "rollback", crash)
    for _ in range(20):
        world.scaler.fail_next("find_group", TransientError("Throttling", retry_after=1))
    capsys.readouterr()

    # WHEN the state machine runs it
    run = world.interpreter.run(request(), "rollback-crash")

    # THEN the execution ends in RollbackFailed and the rollback-failed alarm's metric crossed its threshold
    assert run.error == "RollbackFailed"
    emitted = emf(capsys.readouterr().out)
    assert fires(own_metric_alarms()["RollbackFailedAlarm"], emitted)


# ------------------------------------------------------------------------------------------ off-hours


def handler_module(name: str) -> Any:
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    module = importlib.import_module(f"{name}.app")
    module.logger.registered_handler.stream = sys.stdout  # Powertools binds the stream at import
    return module


def tick(at: Any, execution_id: str) -> dict[str, str]:
    return {"scheduled_time": at.isoformat(), "execution_id": execution_id}


@pytest.fixture
def lambda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGHTSIZER_CLUSTER_NAME", CLUSTER)
    monkeypatch.setenv("AWS_REGION", "us-east-1")


def test_an_overdue_restore_fires_restore_overdue_with_its_node_group(
    lambda_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.offhours_world import MONDAY_MORNING, SATURDAY_NOON, make_world
    from tests.unit.test_offhours import ice

    # GIVEN a node group scaled to zero for the weekend, and no capacity on Monday morning
    world = make_world()
    world.run(SATURDAY_NOON)
    world.aws.capacity["gpu-a10g"] = 0
    world.aws.launch_ready = False
    world.aws.failures["eks-gpu-a10g-asg"] = [ice("eks-gpu-a10g-asg", MONDAY_MORNING + timedelta(seconds=7))]
    app = handler_module("offhours")
    monkeypatch.setattr(
        "rightsizer.wiring.lambda_runtime", lambda: SimpleNamespace(offhours=lambda: world.deps)
    )

    # WHEN the off-hours ticks run through the handler: at the restore, and past restore_deadline (30 min)
    world.clock[0] = MONDAY_MORNING
    app.handler(tick(MONDAY_MORNING, "t-1"), LambdaContext())
    on_time = emf(capsys.readouterr().out)
    world.clock[0] = MONDAY_MORNING + timedelta(minutes=31)
    report = app.handler(tick(MONDAY_MORNING + timedelta(minutes=31), "t-2"), LambdaContext())
    late = emf(capsys.readouterr().out)

    # THEN only the late tick fires the alarm, and the group's own series names it (dashboard panel)
    alarm = own_metric_alarms()["RestoreOverdueAlarm"]
    assert not fires(alarm, on_time)
    assert fires(alarm, late)
    assert report["groups"][0]["restore_overdue"] is True
    per_group = [dims for _ns, name, dims, _v in late if name == "RestoreOverdue" and "node_group" in dims]
    assert per_group == [{"cluster": CLUSTER, "node_group": "gpu-a10g", "service": "offhours"}]


# ------------------------------------------------------------------------------------------ assessments


def test_an_assessment_whose_metric_queries_mostly_failed_fires_assessments_failed(
    lambda_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an observation whose Prometheus queries mostly failed (issue 27: never a quiet plan of unknowns)
    def observe(at: Any) -> Any:
        raise MetricsFailed("13 of 14 Prometheus queries failed, first metrics/up.json: HTTP 400 (bad_data)")

    deps = AssessmentDeps(
        cluster_name=CLUSTER,
        observe=observe,
        policy=Policy(),
        cluster=FakeClusterWriter(clock=FakeClock(AT)),
        state=MemoryState(CLUSTER),
        starter=SimpleNamespace(start=lambda request: "never"),
        plans=MemoryPlans(),
    )
    assess = handler_module("assess")
    monkeypatch.setattr("rightsizer.wiring.lambda_runtime", lambda: SimpleNamespace(assessment=lambda: deps))
    capsys.readouterr()

    # WHEN the assess handler runs the tick
    with pytest.raises(MetricsFailed):
        assess.handler(tick(AT, "assess-failed"), LambdaContext())

    # THEN the run failed (Lambda Errors: FunctionErrorsAlarm) and its own alarm's metric crossed the threshold
    emitted = emf(capsys.readouterr().out)
    fired = {name for name, alarm in own_metric_alarms().items() if fires(alarm, emitted)}
    assert fired == {"AssessmentsFailedAlarm"}


# ------------------------------------------------------------------------------ the template's alarms


def test_every_failure_class_has_an_alarm_on_the_topic() -> None:
    found = alarms()
    assert {
        "AssessmentsFailedAlarm",
        "DrainsFailedAlarm",
        "DrainsRolledBackAlarm",
        "RollbackFailedAlarm",
        "RestoreOverdueAlarm",
        "FunctionErrorsAlarm",
        "FunctionThrottlesAlarm",
        "DrainExecutionsFailedAlarm",
        "FailedInvocationsAlarm",
        "ScheduleDeadLettersAlarm",
    } <= set(found)
    for name, alarm in found.items():
        assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}], name
        assert alarm["TreatMissingData"] == "notBreaching", name
        assert alarm.get("AlarmDescription"), name
    functions = {n for n, r in template()["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
    # Every function is watched for errors and throttles, the fleet's (EnableFleet only) and the sharded
    # assessment's (EnableSharding only) by alarms of the same condition as the functions themselves.
    resources = template()["Resources"]
    for names, metric in (
        (("FunctionErrorsAlarm", "FleetFunctionErrorsAlarm", "ShardFunctionErrorsAlarm"), "Errors"),
        (
            ("FunctionThrottlesAlarm", "FleetFunctionThrottlesAlarm", "ShardFunctionThrottlesAlarm"),
            "Throttles",
        ),
    ):
        watched: set[str] = set()
        for name in names:
            refs = {
                m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]["Ref"]
                for m in found[name]["Metrics"]
                if "MetricStat" in m and m["MetricStat"]["Metric"]["MetricName"] == metric
            }
            conditions = {resources[ref].get("Condition") for ref in refs}
            assert conditions == {resources[name].get("Condition")}, (name, conditions)
            watched |= refs
        assert watched == functions, names
    fleet_states = {
        m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]["Ref"]
        for m in found["FleetExecutionsFailedAlarm"]["Metrics"]
        if "MetricStat" in m
    }
    assert fleet_states == {"FleetStateMachine"}
    shard_states = {
        m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]["Ref"]
        for m in found["ShardExecutionsFailedAlarm"]["Metrics"]
        if "MetricStat" in m
    }
    assert shard_states == {"ShardStateMachine"}
    states = {
        m["MetricStat"]["Metric"]["MetricName"]
        for m in found["DrainExecutionsFailedAlarm"]["Metrics"]
        if "MetricStat" in m
    }
    assert states == {"ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"}


# ------------------------------------------------------------------------------------------ dashboard


def emitted_by_every_handler(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> list[Emitted]:
    """The EMF of a successful, a rolled-back and an un-uncordonable drain, an overdue restore, an
    assessment and a failed one, each through its real handler."""
    from tests.support.offhours_world import MONDAY_MORNING, SATURDAY_NOON, make_world

    capsys.readouterr()
    with drain_world() as ok:
        assert ok.interpreter.run(request(), "ok").status == "SUCCEEDED"
    with drain_world() as rolled:
        blocked_until_deadline(rolled)
        rolled.interpreter.run(request(), "rolled")
    with drain_world() as stuck:
        blocked_until_deadline(stuck)

        def refuse(node: str, execution_id: str) -> bool:
            raise PermanentError("403 Forbidden: patch nodes")

        monkeypatch.setattr(stuck.cluster, "uncordon", refuse)
        stuck.interpreter.run(request(), "stuck")
    world = make_world()
    world.run(SATURDAY_NOON)
    world.aws.capacity["gpu-a10g"] = 0
    world.aws.launch_ready = False
    offhours = handler_module("offhours")
    monkeypatch.setattr(
        "rightsizer.wiring.lambda_runtime", lambda: SimpleNamespace(offhours=lambda: world.deps)
    )
    for minutes in (0, 31):
        world.clock[0] = MONDAY_MORNING + timedelta(minutes=minutes)
        offhours.handler(tick(world.clock[0], f"t-{minutes}"), LambdaContext())

    class Starter:
        def start(self, request: Any) -> str:
            return str(request.execution_id)

    deps = AssessmentDeps(
        cluster_name=CLUSTER,
        observe=lambda at: snapshot(
            [
                gpu_node("idle-1", instance_type="g5.12xlarge", gpus=4, instance_id="i-idle1"),
                # an idle GPU held by a pod: the showback panels' per-namespace and per-team series
                gpu_node("held-1", instance_type="g5.xlarge", gpus=1, instance_id="i-held1"),
            ],
            [pod("notebook-1", "held-1", namespace="ml", gpus=1, labels={"team": "research"})],
            merge_metrics(node_devices("idle-1", 4), node_devices("held-1", 1)),
            at=at,
        ),
        policy=Policy(),
        cluster=FakeClusterWriter(clock=FakeClock(AT)),
        state=MemoryState(CLUSTER),
        starter=Starter(),
        plans=MemoryPlans(),
    )
    assess = handler_module("assess")
    monkeypatch.setattr("rightsizer.wiring.lambda_runtime", lambda: SimpleNamespace(assessment=lambda: deps))
    summary = assess.handler(tick(AT, "assess-1"), LambdaContext())
    assert summary["started"], summary

    def unusable(at: Any) -> Any:
        raise MetricsFailed("13 of 14 Prometheus queries failed")

    monkeypatch.setattr(
        "rightsizer.wiring.lambda_runtime",
        lambda: SimpleNamespace(assessment=lambda: replace(deps, observe=unusable)),
    )
    with pytest.raises(MetricsFailed):
        assess.handler(tick(AT, "assess-2"), LambdaContext())
    return emf(capsys.readouterr().out)


def test_dashboard_panels_query_metrics_the_handlers_emit_with_those_dimensions(
    lambda_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN what the handlers print for every outcome the dashboard shows
    emitted = emitted_by_every_handler(monkeypatch, capsys)
    dashboard = json.loads(
        (ROOT / "infra" / "dashboards" / "gpu-rightsizer.json").read_text(encoding="utf-8")
    )
    targets = [
        (panel["title"], t)
        for panel in dashboard["panels"]
        for t in panel.get("targets", [])
        if t.get("datasource", {}).get("type") == "cloudwatch"
    ]
    assert len(targets) >= 10

    def matches(target: dict[str, Any], dims: dict[str, str]) -> bool:
        wanted = {k: CLUSTER if v == "$cluster" else v for k, v in target["dimensions"].items()}
        if target["matchExact"] and set(wanted) != set(dims):
            return False
        return all(k in dims and v in ("*", dims[k]) for k, v in wanted.items())

    # THEN every CloudWatch panel finds its metric under exactly the dimension names the handlers use
    for title, target in targets:
        assert target["namespace"] == "GPURightsizer", title
        series = [
            d for ns, name, d, _v in emitted if ns == target["namespace"] and name == target["metricName"]
        ]
        assert series, (title, target["metricName"], "never emitted")
        assert any(matches(target, dims) for dims in series), (title, target["dimensions"], series[:3])
    # AND every failure metric an alarm watches is on the dashboard
    shown = {t["metricName"] for _title, t in targets}
    assert {a["MetricName"] for a in own_metric_alarms().values()} <= shown
