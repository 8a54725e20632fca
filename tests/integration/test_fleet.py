"""The fleet end to end (issue 31): discovery on moto Organizations/EKS through cross-account spoke roles,
the fleet state machine's Distributed Map run by the project's ASL interpreter with the real handlers, every
outcome produced by a fault in one cluster while the others finish, and ``rightsizer fleet plan|status``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import boto3
import pytest

from rightsizer.cli import main
from rightsizer.domain.fleet import FIX_HINTS, ClusterResult, FleetReport, FleetTarget, fleet_report
from rightsizer.testing.moto_eks import MotoServer, reset_moto
from rightsizer.wiring.fleet import FleetSettings, discover_run
from tests.builders import AT, rfc
from tests.support.fleet_scale import fleet_definition, fleet_machine
from tests.support.fleet_world import (
    EXTERNAL_ID,
    NOT_ENABLED,
    ROLE,
    FleetWorld,
    build_world,
    route_eks_to_doubles,
)
from tests.support.iam import recording
from tests.support.planted_cluster import dcgm_families

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "fleet-hub-bucket"
HUB = "123456789012"
POLICY = "max_nodes_per_run: 10\nmax_nodes_per_node_group: 10\ncooldown: 0s\n"


@pytest.fixture(scope="module")
def prometheus_url(prometheus_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Prometheus with the planted DCGM history, shared by the module's tests."""
    from tests.support.prometheus_server import openmetrics_lines, start_prometheus

    def write(path: Path) -> None:
        path.write_text("".join(line + "\n" for line in openmetrics_lines(dcgm_families())), encoding="utf-8")

    server = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("prom"), write_openmetrics=write)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def world(moto_server: MotoServer, prometheus_url: str) -> Iterator[FleetWorld]:
    """The organisation, the hub's bucket and the fleet functions' environment, built once per module (the
    tests only add their own S3 objects and stacks)."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "RIGHTSIZER_FLEET_BUCKET": BUCKET,
        "RIGHTSIZER_FLEET_ROLE_NAME": ROLE,
        "RIGHTSIZER_FLEET_EXTERNAL_ID": EXTERNAL_ID,
        "RIGHTSIZER_FLEET_REGIONS": f"us-east-1,us-west-2,{NOT_ENABLED}",
        "RIGHTSIZER_FLEET_MAX_CONCURRENCY": "2",
        "RIGHTSIZER_AWS_ENDPOINT_URL": moto_server.endpoint_url,
        "AWS_REGION": "us-east-1",
        "RIGHTSIZER_CLUSTER_NAME": "hub",
        "RIGHTSIZER_POLICY_INLINE": POLICY,
        "RIGHTSIZER_PRICING_API": "false",
    }
    with pytest.MonkeyPatch.context() as patch, ExitStack() as stack:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        reset_moto(moto_server.endpoint_url)
        boto3.client("s3", region_name="us-east-1", endpoint_url=moto_server.endpoint_url).create_bucket(
            Bucket=BUCKET
        )
        built = build_world(moto_server.endpoint_url, prometheus_url, stack)
        with route_eks_to_doubles(built, patch):
            yield built


def fleet_grants() -> set[str]:
    """Every action the spoke role and the hub's fleet roles grant (both templates, every condition on)."""
    from tests.unit.test_fleet_template import _actions, _load

    hub = _load("template.yaml")["Resources"]
    roles = [hub[n] for n in ("FleetDiscoverRole", "FleetMemberRole", "FleetSummarizeRole")]
    roles.append(_load("infra/spoke/spoke.yaml")["Resources"]["SpokeRole"])
    return {a for role in roles for a in _actions(role)}


def s3_json(endpoint_url: str, key: str) -> Any:
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint_url)
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


# ------------------------------------------------------------------------------------------- discovery


def test_discovery_lists_every_cluster_of_every_account_through_its_spoke_role(world: FleetWorld) -> None:
    # WHEN discovery runs over Organizations' accounts x the three regions
    answer = discover_run(FleetSettings(), "run-1")  # type: ignore[call-arg]

    # THEN the manifest in S3 lists every cluster of both member accounts with its Prometheus (cluster tag)
    manifest = s3_json(world.endpoint_url, answer["manifest"]["key"])
    keys = [f"{e['account_id']}/{e['region']}/{e['cluster']}" for e in manifest]
    clusters = [k for k, e in zip(keys, manifest, strict=True) if "skip" not in e]
    assert clusters == sorted(
        world.key(a, r, c) for a, r, c in (("A", "us-east-1", "ok"), ("A", "us-east-1", "private"),
                                             ("A", "us-west-2", "slow"), ("B", "us-east-1", "denied"),
                                             ("B", "us-east-1", "nometrics"))
    )  # fmt: skip
    assert {e.get("prometheus_url") for e in manifest if "skip" not in e} == {world.prometheus_url}
    # AND the region no account has enabled is one entry per account, not a silent gap
    skipped = {k: e["skip"] for k, e in zip(keys, manifest, strict=True) if "skip" in e}
    assert skipped == {f"{a}/{NOT_ENABLED}/*": "region_not_enabled" for a in (HUB, *world.accounts.values())}
    assert answer["manifest"]["count"] == len(manifest) == 8
    assert (answer["max_concurrency"], answer["tolerated_failure_percentage"]) == (2, 100)


def test_discovery_applies_the_deny_list_and_reads_an_operator_manifest(
    world: FleetWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIGHTSIZER_FLEET_DENY", f"*/{NOT_ENABLED}/*,{world.accounts['B']}/*")
    denied = s3_json(world.endpoint_url, discover_run(FleetSettings(), "r2")["manifest"]["key"])  # type: ignore[call-arg]
    assert sorted(e["cluster"] for e in denied) == ["ok", "private", "slow"]

    # An operator's manifest replaces discovery (and is filtered the same way)
    entries = [
        {
            "account_id": world.accounts["A"],
            "region": "us-east-1",
            "cluster": "ok",
            "prometheus_url": "http://p",
        }
    ]
    boto3.client("s3", region_name="us-east-1", endpoint_url=world.endpoint_url).put_object(
        Bucket=BUCKET, Key="operator/manifest.json", Body=json.dumps(entries).encode()
    )
    monkeypatch.setenv("RIGHTSIZER_FLEET_MANIFEST_KEY", "operator/manifest.json")
    given = s3_json(world.endpoint_url, discover_run(FleetSettings(), "r3")["manifest"]["key"])  # type: ignore[call-arg]
    assert given == [{**entries[0], "prometheus_auth": "sigv4"}]


# ------------------------------------------------------------------------------------- state machine


def test_the_fleet_reports_every_outcome_while_the_other_clusters_finish(world: FleetWorld) -> None:
    # GIVEN five clusters, four of them broken in a different way, and a region no account enabled
    machine = fleet_machine(world.endpoint_url, BUCKET, killed=frozenset({"slow"}))

    # WHEN the fleet state machine runs (discover -> Distributed Map, 2 at a time -> summary)
    with recording() as recorder:
        run = machine.run({}, "fleet-run-1")

    # THEN the fleet succeeds: every child ended with its cluster's outcome
    assert run.status == "SUCCEEDED", (run.error, run.cause)
    (map_run,) = machine.map_runs
    assert (map_run.items, map_run.succeeded, map_run.failed) == (8, 8, 0)
    report = FleetReport.model_validate(s3_json(world.endpoint_url, "fleet/reports/latest.json"))
    assert report == FleetReport.model_validate(s3_json(world.endpoint_url, "fleet/reports/fleet-run-1.json"))
    outcomes = {r.key: r.outcome for r in report.results}
    assert outcomes == {
        world.key("A", "us-east-1", "ok"): "assessed",
        world.key("A", "us-east-1", "private"): "unreachable_endpoint",
        world.key("A", "us-west-2", "slow"): "timeout",
        world.key("B", "us-east-1", "denied"): "access_denied",
        world.key("B", "us-east-1", "nometrics"): "metrics_unavailable",
        **{f"{a}/{NOT_ENABLED}/*": "region_not_enabled" for a in (HUB, *world.accounts.values())},
    }
    # AND each broken cluster carries its fix hint and what went wrong
    for row in report.results:
        assert row.hint == FIX_HINTS[row.outcome]
    rows = {r.cluster: r for r in report.results}
    assert "may not list nodes" in str(rows["denied"].error)
    assert "Sandbox.Timedout" in str(rows["slow"].error)
    # AND the assessed cluster's decisions are the single-cluster assessment's: two idle A10G nodes
    ok = rows["ok"]
    assert ok.verdicts == {"idle": 2, "underutilized": 1}
    assert ok.idle_usd_per_hour == pytest.approx(2 * 1.212)  # g5.2xlarge, packaged us-east-1 price
    assert ok.actions == {"recommend": 1, "scale_in": 2}
    assert report.outcomes["assessed"] == 1 and report.verdicts["idle"] == 2
    # AND every cluster was reached with its own account's spoke role (cross-account AssumeRole)
    signed = dict(world.signed_by)
    assert signed["ok"] == signed["private"] == world.accounts["A"]
    assert signed["denied"] == signed["nometrics"] == world.accounts["B"]
    # AND one invocation per cluster plus discovery and summary: O(clusters), no recursion
    assert len(run.invocations) == 1 + 8 + 1
    # AND every AWS call is declared by the module that made it and granted by a fleet role (hub or spoke)
    undeclared = {
        (c.owner, c.action)
        for c in recorder.calls
        if c.action not in getattr(sys.modules[c.owner], "IAM_ACTIONS", ())
    }
    assert not undeclared
    granted = fleet_grants()
    assert {c.action for c in recorder.calls} - granted - {"sts:GetCallerIdentity"} == set()
    assert {"organizations:ListAccounts", "eks:ListClusters", "ec2:DescribeRegions", "sts:AssumeRole",
            "eks:DescribeCluster", "eks:ListNodegroups", "s3:PutObject", "s3:GetObject"} <= {c.action for c in recorder.calls}  # fmt: skip


def test_a_map_run_over_its_failure_threshold_still_writes_the_report_then_fails(
    world: FleetWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no failure is tolerated and a child execution fails outside the member's own Catch
    monkeypatch.setenv("RIGHTSIZER_FLEET_TOLERATED_FAILURE_PERCENTAGE", "0")
    monkeypatch.setenv("RIGHTSIZER_FLEET_ALLOW", "*/us-west-2/*")
    definition = fleet_definition(BUCKET)
    del definition["States"]["AssessClusters"]["ItemProcessor"]["States"]["AssessCluster"]["Catch"]
    machine = fleet_machine(world.endpoint_url, BUCKET, killed=frozenset({"slow"}))
    machine.definition = definition

    run = machine.run({}, "fleet-run-2")

    # THEN the execution fails loudly, after the summary wrote a report naming every cluster
    assert (run.status, run.error) == ("FAILED", "FleetMapFailed")
    report = FleetReport.model_validate(s3_json(world.endpoint_url, "fleet/reports/fleet-run-2.json"))
    # (a failed Map run hands no results on: each unfinished cluster is reported with the run's error)
    assert [(r.cluster, r.outcome) for r in report.results] == [("slow", "failed")]
    assert "States.ExceedToleratedFailureThreshold" in str(report.results[0].error)


# ----------------------------------------------------------------------------------------------- CLI


def test_fleet_plan_assesses_a_manifest_locally_under_assumed_roles_and_kubeconfig_contexts(
    world: FleetWorld, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", world.endpoint_url)  # the CLI's own boto3 configuration
    from tests.support.planted_cluster import write_kubeconfig

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", world.doubles["ok"].base_url)
    a, b = world.accounts["A"], world.accounts["B"]
    manifest = [
        {"account_id": a, "region": "us-east-1", "cluster": "ok", "prometheus_url": world.prometheus_url},
        {"account_id": b, "region": "us-east-1", "cluster": "denied", "prometheus_url": world.prometheus_url},
        {"account_id": b, "region": "us-east-1", "cluster": "nometrics", "prometheus_url": world.prometheus_url},
        # The same cluster reached through a kubeconfig context (the AWS side still under A's role)
        {"account_id": a, "region": "us-east-1", "cluster": "ok", "context": "double",
         "prometheus_url": world.prometheus_url, "role_arn": f"arn:aws:iam::{a}:role/{ROLE}"},
    ]  # fmt: skip
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(manifest[1:]), encoding="utf-8")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    argv = ["fleet", "plan", "--manifest", str(path), "--role-name", ROLE, "--external-id", EXTERNAL_ID,
            "--kubeconfig", str(kubeconfig), "--policy", str(policy), "--no-price-list-api", "--at", rfc(AT), "--concurrency", "2"]  # fmt: skip

    code = main([*argv, "--json"])
    out, err = capsys.readouterr()

    assert code == 1, err  # some clusters are not assessed
    report = FleetReport.model_validate_json(out)
    assert {r.cluster: r.outcome for r in report.results} == {
        "ok": "assessed",
        "denied": "access_denied",
        "nometrics": "metrics_unavailable",
    }
    assert {r.cluster: r.verdicts for r in report.results}["ok"] == {"idle": 2, "underutilized": 1}

    # The table names each broken cluster with its fix
    path.write_text(json.dumps(manifest[:1]), encoding="utf-8")
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "assessed" in table and "1 clusters: assessed 1" in table


def test_fleet_plan_refuses_a_malformed_manifest_naming_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("- {account_id: '1', region: us-east-1, cluster: c}\n", encoding="utf-8")
    assert main(["fleet", "plan", "--manifest", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "account_id" in err


def test_fleet_status_reads_the_deployed_report(
    world: FleetWorld, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", world.endpoint_url)  # the CLI's own boto3 configuration
    # GIVEN a hub stack whose fleet bucket holds a report
    target = FleetTarget(account_id=world.accounts["B"], region="us-east-1", cluster="denied")
    report = fleet_report("fleet-run-3", rfc(AT), [ClusterResult.of(target, "access_denied", "403")])
    boto3.client("s3", region_name="us-east-1", endpoint_url=world.endpoint_url).put_object(
        Bucket=BUCKET, Key="fleet/reports/latest.json", Body=report.model_dump_json().encode()
    )
    cfn = boto3.client("cloudformation", region_name="us-east-1", endpoint_url=world.endpoint_url)
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"FleetBucketName": {"Value": BUCKET}},
    }
    cfn.create_stack(StackName="hub", TemplateBody=json.dumps(template))

    # WHEN the operator asks for it, THEN it is printed (exit 1: a cluster is not assessed)
    code = main(["fleet", "status", "--stack", "hub", "--region", "us-east-1", "--json"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert FleetReport.model_validate_json(out) == report
    assert main(["fleet", "status", "--stack", "hub", "--region", "us-east-1"]) == 1
    table = capsys.readouterr().out
    assert "access_denied" in table and FIX_HINTS["access_denied"] in table
    # AND a stack without a fleet is bad input
    assert main(["fleet", "status", "--stack", "nope", "--region", "us-east-1"]) == 2
