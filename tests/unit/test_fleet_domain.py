"""The fleet's pure decisions (issue 31): manifest filtering, regions, outcomes and the report."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rightsizer.domain.fleet import (
    FIX_HINTS,
    ClusterResult,
    FleetRules,
    FleetTarget,
    assessed_outcome,
    classify_failure,
    dedupe,
    fleet_report,
    regions_to_scan,
    target_from_tags,
)

A, B = "111111111111", "222222222222"


def target(account: str = A, region: str = "us-east-1", cluster: str = "gpu") -> FleetTarget:
    return FleetTarget(account_id=account, region=region, cluster=cluster, prometheus_url="http://p:9090")


@pytest.mark.parametrize(
    ("allow", "deny", "key", "admitted"),
    [
        ("", "", f"{A}/us-east-1/gpu", True),
        ("*/eu-*/*", "", f"{A}/us-east-1/gpu", False),
        ("*/eu-*/*", "", f"{A}/eu-west-1/gpu", True),
        ("", f"{A}/*", f"{A}/eu-west-1/gpu", False),
        (f"{A}/*", "*/*/gpu-test", f"{A}/eu-west-1/gpu-test", False),  # deny wins over allow
        ("*/*/gpu-*, */*/train", "", f"{B}/us-west-2/train", True),
    ],
)
def test_rules_admit_by_account_region_cluster_patterns(
    allow: str, deny: str, key: str, admitted: bool
) -> None:
    assert FleetRules.parse(allow, deny).admits(key) is admitted


def test_dedupe_keeps_the_first_entry_of_a_key_and_sorts() -> None:
    first = target(B)
    again = first.model_copy(update={"prometheus_url": "http://other"})
    kept = dedupe([first, target(A), again], FleetRules())
    assert [t.key for t in kept] == [f"{A}/us-east-1/gpu", f"{B}/us-east-1/gpu"]
    assert kept[1].prometheus_url == "http://p:9090"


def test_regions_not_enabled_are_split_out_in_order() -> None:
    assert regions_to_scan(["us-east-1", "me-south-1", "eu-west-1"], ["eu-west-1", "us-east-1"]) == (
        ["us-east-1", "eu-west-1"],
        ["me-south-1"],
    )


def test_a_target_reads_its_prometheus_from_the_cluster_tags() -> None:
    amp = "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1"
    assert (
        target_from_tags(A, "eu-west-1", "c", {"rightsizer.io/prometheus-url": amp}).prometheus_auth
        == "sigv4"
    )
    plain = target_from_tags(A, "eu-west-1", "c", {"rightsizer.io/prometheus-url": "http://10.0.0.1:9090"})
    assert (plain.prometheus_url, plain.prometheus_auth) == ("http://10.0.0.1:9090", "none")
    assert target_from_tags(A, "eu-west-1", "c", {}).prometheus_url is None


@pytest.mark.parametrize(
    "entry",
    [
        {"account_id": "1234", "region": "us-east-1", "cluster": "c"},
        {"account_id": A, "region": "nowhere", "cluster": "c"},
        {"account_id": A, "region": "us-east-1", "cluster": ""},
        {"account_id": A, "region": "us-east-1", "cluster": "c", "colour": "blue"},
        {"account_id": A, "region": "us-east-1", "cluster": "c", "role_arn": "not-an-arn"},
    ],
)
def test_a_malformed_manifest_entry_is_refused(entry: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        FleetTarget.model_validate(entry)


@pytest.mark.parametrize(
    ("kind", "code", "message", "outcome"),
    [
        ("aws", "AccessDenied", "sts:AssumeRole", "access_denied"),
        ("aws", "AccessDeniedException", "", "access_denied"),
        ("access", "", "403 Forbidden", "access_denied"),
        ("aws", "InvalidClientTokenId", "", "region_not_enabled"),
        ("aws", "UnrecognizedClientException", "", "region_not_enabled"),
        ("aws", "RegionDisabledException", "", "region_not_enabled"),
        ("unreachable", "", "connection refused", "unreachable_endpoint"),
        ("metrics", "", "bad_data", "metrics_unavailable"),
        ("", "States.Timeout", "", "timeout"),
        ("", "Sandbox.Timedout", "", "timeout"),
        ("timeout", "", "", "timeout"),
        ("aws", "ThrottlingException", "", "failed"),
        ("", "ValueError", "", "failed"),
    ],
)
def test_failures_are_classified_into_outcomes(kind: str, code: str, message: str, outcome: str) -> None:
    assert classify_failure(kind, code, message) == outcome


def test_every_outcome_but_assessed_has_a_fix_hint() -> None:
    for outcome, hint in FIX_HINTS.items():
        assert bool(hint) is (outcome != "assessed"), outcome
        assert ClusterResult.of(target(), outcome).hint == hint


def test_metrics_unavailable_only_when_every_gpu_node_lacks_metrics() -> None:
    assert assessed_outcome([["no_series"], ["stale_metrics:exporter"]], 2) == "metrics_unavailable"
    assert assessed_outcome([["no_series"]], 2) == "assessed"  # one node had its metrics
    assert assessed_outcome([["no_series"], ["gpu_count_mismatch"]], 2) == "assessed"
    assert assessed_outcome([], 0) == "assessed"  # no GPU node: nothing was missing


def test_the_report_sums_verdicts_idle_cost_and_actions_per_cluster() -> None:
    one = ClusterResult(
        key="k1", account_id=A, region="us-east-1", cluster="a", outcome="assessed",
        verdicts={"idle": 2, "busy": 1}, idle_usd_per_hour=2.5, hourly_savings_usd=1.25,
        actions={"scale_in": 1},
    )  # fmt: skip
    two = one.model_copy(
        update={"key": "k2", "cluster": "b", "verdicts": {"idle": 1}, "actions": {"scale_in": 2}}
    )
    broken = ClusterResult.of(target(B, cluster="c"), "access_denied", "AccessDenied")
    report = fleet_report("run", "2026-01-01T00:00:00Z", [two, broken, one, one])
    assert report.clusters == 3
    assert report.outcomes == {"access_denied": 1, "assessed": 2}
    assert report.verdicts == {"busy": 1, "idle": 3}
    assert report.idle_usd_per_hour == 5.0 and report.hourly_savings_usd == 2.5
    assert report.actions == {"scale_in": 3}
    assert [r.key for r in report.results] == [f"{B}/us-east-1/c", "k1", "k2"]
