"""A fleet of N simulated clusters on moto (issue 31 item 5), shared by ``tests/integration/test_fleet_scale.py``
and ``benchmarks/fleet_scale.py``: an organisation of ``accounts`` member accounts, each with
``per_region`` EKS clusters in each of ``regions``, created through each account's spoke role; and the whole
fleet state machine (discovery on moto, the Distributed Map, the summary) run by the ASL interpreter with
the real handlers, each cluster's assessment stubbed by a deterministic answer (every 10th cluster's
Kubernetes API unreachable), so the run measures the fleet's own cost, not N assessments.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3

from rightsizer.domain.decisions import DecisionRecord
from rightsizer.domain.fleet import FleetReport
from rightsizer.services.fleet import ClusterAssessment
from rightsizer.testing.fakes import FakeClock
from tests.builders import AT
from tests.support.asl import AslInterpreter, Execution, LambdaContext, LambdaKilled
from tests.support.fleet_world import EXTERNAL_ID, ROLE

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "fleet-scale-bucket"
ARNS = {
    name: f"arn:aws:lambda:us-east-1:123456789012:function:fleet-{name}"
    for name in ("discover", "member", "summarize")
}
PROMETHEUS = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-fleet"


def build_organisation(endpoint_url: str, accounts: int, regions: list[str], per_region: int) -> list[str]:
    """Create the organisation and its clusters; returns the member account ids."""
    orgs = boto3.client("organizations", region_name="us-east-1", endpoint_url=endpoint_url)
    orgs.create_organization(FeatureSet="ALL")
    ids = [
        orgs.create_account(Email=f"a{i}@example.com", AccountName=f"gpu-{i}")["CreateAccountStatus"][
            "AccountId"
        ]
        for i in range(accounts)
    ]
    # The clusters go straight into the in-process moto backend of each account and region: creating a
    # thousand through the API would measure moto, not the fleet (discovery reads them through the API).
    from unittest import mock

    from moto.eks.models import eks_backends

    # moto checks each role ARN's partition by loading botocore's endpoints.json anew (~0.3 s a cluster).
    with mock.patch("moto.eks.models.validate_role_arn"):
        _clusters(eks_backends, ids, regions, per_region)
    boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint_url).create_bucket(Bucket=BUCKET)
    return ids


def _clusters(backends: Any, ids: list[str], regions: list[str], per_region: int) -> None:
    for account in ids:
        for region in regions:
            backend = backends[account][region]
            for index in range(per_region):
                backend.create_cluster(
                    name=f"gpu-{index:03d}",
                    role_arn=f"arn:aws:iam::{account}:role/eks",
                    resources_vpc_config={"subnetIds": []},
                    tags={"rightsizer.io/prometheus-url": PROMETHEUS},
                )


def fleet_environment(endpoint_url: str, regions: list[str], concurrency: int) -> dict[str, str]:
    """The fleet functions' environment (what ``template.yaml`` sets under EnableFleet)."""
    return {
        "RIGHTSIZER_FLEET_BUCKET": BUCKET,
        "RIGHTSIZER_FLEET_ROLE_NAME": ROLE,
        "RIGHTSIZER_FLEET_EXTERNAL_ID": EXTERNAL_ID,
        "RIGHTSIZER_FLEET_REGIONS": ",".join(regions),
        "RIGHTSIZER_FLEET_MAX_CONCURRENCY": str(concurrency),
        "RIGHTSIZER_AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": "us-east-1",
        "RIGHTSIZER_CLUSTER_NAME": "hub",
        "RIGHTSIZER_POLICY_INLINE": "{}",
        "RIGHTSIZER_PRICING_API": "false",
    }


def _record(cluster: str, node: str, verdict: str, usd: float) -> DecisionRecord:
    return DecisionRecord(
        cluster=cluster, at="2026-11-02T10:00:00Z", node=node, node_group="gpu", instance_id=None,
        instance_type="g5.2xlarge", gpus=1, verdict=verdict, reasons=[], gpu_activity_max_pct=None,  # type: ignore[arg-type]
        fb_used_max_mib=None, coverage=1.0, hourly_usd=usd, recommendation=None, action="none",
        execution_id=None, why_not=None, dry_run=True,
    )  # fmt: skip


def stub_assessment(config: Any, at: datetime) -> ClusterAssessment:
    """A cluster's answer without observing it: 2 idle and 3 busy g5.2xlarge nodes; every 10th cluster's
    API endpoint refuses connections (``ConnectionRefusedError``: ``unreachable_endpoint``)."""
    name = str(config.cluster.name)
    if int(name.rsplit("-", 1)[1]) % 10 == 9:
        raise ConnectionRefusedError(f"{name}: connection refused")
    records = [_record(name, f"n{i}", "idle" if i < 2 else "busy", 1.212) for i in range(5)]
    return ClusterAssessment({"busy": 3, "idle": 2}, records, {"scale_in": 2}, 2.424)


def fleet_definition(bucket: str) -> dict[str, Any]:
    """``infra/statemachine/fleet.asl.json`` with its DefinitionSubstitutions applied, as SAM deploys it."""
    text = (ROOT / "infra" / "statemachine" / "fleet.asl.json").read_text(encoding="utf-8")
    for name, arn in ARNS.items():
        text = text.replace("${Fleet" + name.capitalize() + "FunctionArn}", arn)
    return dict(json.loads(text.replace("${FleetBucketName}", bucket)))


def fleet_machine(
    endpoint_url: str, bucket: str = BUCKET, *, killed: frozenset[str] = frozenset()
) -> AslInterpreter:
    """The fleet ASL with its Lambda tasks served by ``functions/fleet/app`` in this process; the member of a
    cluster named in ``killed`` is ended by Lambda at its timeout (``Sandbox.Timedout``)."""
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    app = importlib.import_module("fleet.app")
    handlers = {ARNS["discover"]: app.discover, ARNS["member"]: app.member, ARNS["summarize"]: app.summarize}

    def invoke(arn: str, payload: dict[str, Any]) -> Any:
        if arn == ARNS["member"] and payload["target"]["cluster"] in killed:
            raise LambdaKilled("Task timed out after 300.00 seconds")
        name = arn.rsplit(":", 1)[1]
        return handlers[arn](payload, LambdaContext(function_name=name, invoked_function_arn=arn))

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint_url)
    return AslInterpreter(fleet_definition(bucket), invoke, FakeClock(AT), s3=s3, max_transitions=1_000_000)


@dataclass(frozen=True)
class ScaleRun:
    """One measured fleet run: the execution, the report, wall seconds and the traced peak (bytes)."""

    execution: Execution
    report: FleetReport
    wall_s: float
    peak_bytes: int
    fake_s: float


@contextmanager
def stubbed(monkeypatch_setattr: Any) -> Iterator[None]:
    """Replace each cluster's assessment by :func:`stub_assessment` (``monkeypatch.setattr`` given)."""
    import rightsizer.wiring.fleet as wiring

    monkeypatch_setattr(wiring, "assess_config", stub_assessment)
    yield


def run_fleet(endpoint_url: str) -> ScaleRun:
    """Run the fleet state machine once, measuring wall time and the traced memory peak."""
    machine = fleet_machine(endpoint_url)
    began_fake = machine.clock()
    tracemalloc.start()
    began = time.perf_counter()
    execution = machine.run({}, "fleet-scale")
    wall = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint_url)
    body = s3.get_object(Bucket=BUCKET, Key="fleet/reports/latest.json")["Body"].read()
    report = FleetReport.model_validate_json(body)
    return ScaleRun(execution, report, wall, peak, machine.clock() - began_fake)
