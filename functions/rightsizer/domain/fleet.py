"""The fleet (issue 31): which clusters of an organisation are assessed, what became of each, and the report.

Pure data and decisions, no I/O (docs/architecture.md §2 "Fleet"): the manifest entry (:class:`FleetTarget`,
one EKS cluster in one account and region), the operator's allow/deny rules (:class:`FleetRules`), the
outcome of one cluster with its fix hint (:class:`ClusterResult`, :func:`classify_failure`,
:func:`assessed_outcome`) and the fleet report aggregated from the Distributed Map's results
(:func:`fleet_report`).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

#: What became of one cluster in one fleet run.
Outcome = Literal[
    "assessed",
    "unreachable_endpoint",
    "access_denied",
    "metrics_unavailable",
    "timeout",
    "region_not_enabled",
    "failed",
]

#: The fix an operator applies for each outcome but ``assessed`` (shown beside the cluster in the report).
FIX_HINTS: Final[Mapping[Outcome, str]] = {
    "assessed": "",
    "unreachable_endpoint": (
        "the hub cannot reach the cluster's API endpoint or its Prometheus (private-only endpoint, "
        "in-cluster Prometheus): enable the public endpoint with an allow list including the hub's NAT "
        "addresses, remote-write to Amazon Managed Prometheus, or deploy the single-cluster stack in the "
        'spoke account (docs/fleet.md "Clusters the hub cannot reach")'
    ),
    "access_denied": (
        "deploy infra/spoke/spoke.yaml with StackSets into the account (the hub's FleetExternalId and "
        "account id), give the cluster an EKS access entry for the spoke role (the spoke's ClusterName "
        "parameter, Kubernetes group rightsizer-read) and apply infra/k8s/rbac.yaml in the cluster"
    ),
    "metrics_unavailable": (
        "no DCGM metrics for the cluster's GPU nodes: tag the cluster rightsizer.io/prometheus-url with "
        "its AMP workspace URL (or list prometheus_url in the manifest), and check that dcgm-exporter is "
        "scraped (infra/k8s/components/dcgm-servicemonitor)"
    ),
    "timeout": (
        "the cluster's assessment outlived the fleet member function's 300 s: assess this cluster with "
        "its own stack (docs/architecture.md §8 gives the time per GPU node), or lower "
        "prometheus.deadline so a slow Prometheus ends as metrics_unavailable"
    ),
    "region_not_enabled": (
        "the region is not enabled in the account (Account Management opt-in region): enable it, or "
        "remove it from FleetRegions / deny it (FleetDeny account/region/*)"
    ),
    "failed": "an unexpected error: read the error text and the fleet member function's log",
}

#: Reasons that make a node ``unknown`` because its metrics are missing (domain.verdicts.REASON_CODES).
METRICS_REASONS: Final = frozenset(
    {
        "no_series",
        "coverage_below_min",
        "stale_metrics",
        "exporter_frozen",
        "non_finite",
        "partial_response",
        "series_unmapped",
        "no_liveness_signal",
    }
)

#: The cluster name of an entry that stands for a whole (account, region) whose clusters were not listed.
ANY_CLUSTER: Final = "*"

#: EKS cluster tags discovery reads (docs/fleet.md): the Prometheus URL and auth, and acting opt-in.
TAG_PROMETHEUS_URL: Final = "rightsizer.io/prometheus-url"
TAG_PROMETHEUS_AUTH: Final = "rightsizer.io/prometheus-auth"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FleetTarget(_Frozen):
    """One manifest entry: an EKS cluster in an account and region (the Distributed Map's item).

    ``prometheus_url`` / ``prometheus_auth`` say where its DCGM metrics are (AMP: ``sigv4``, signed with
    the spoke role); ``context`` is a kubeconfig context (``rightsizer fleet plan`` only, instead of EKS
    authentication); ``role_arn`` overrides the spoke role the account's entries are assessed under;
    ``skip`` is an outcome discovery already knows (``region_not_enabled``), so the child only reports it.
    """

    account_id: str = Field(pattern=r"^[0-9]{12}$")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
    cluster: str = Field(min_length=1, max_length=100)
    prometheus_url: str | None = None
    prometheus_auth: Literal["none", "sigv4"] = "sigv4"
    context: str | None = None
    role_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]+$")
    skip: Outcome | None = None

    @property
    def key(self) -> str:
        """``account/region/cluster``: the entry's identity and what allow/deny patterns match."""
        return f"{self.account_id}/{self.region}/{self.cluster}"


class FleetRules(_Frozen):
    """Which discovered clusters the fleet assesses: shell patterns (``fnmatch``) over
    ``account/region/cluster``. An empty ``allow`` admits every cluster; ``deny`` always wins."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @classmethod
    def parse(cls, allow: str, deny: str) -> FleetRules:
        """Rules from the template's comma-separated ``FleetAllow`` / ``FleetDeny`` parameters."""
        return cls(
            allow=tuple(p.strip() for p in allow.split(",") if p.strip()),
            deny=tuple(p.strip() for p in deny.split(",") if p.strip()),
        )

    def admits(self, key: str) -> bool:
        """True when ``key`` (``account/region/cluster``) is allowed and not denied."""
        if any(fnmatch.fnmatchcase(key, p) for p in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(key, p) for p in self.allow)


def regions_to_scan(wanted: Sequence[str], enabled: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split the operator's regions into those enabled in the account and those that are not
    (``ec2:DescribeRegions`` of the account lists only enabled regions): (scan, not enabled), in order."""
    on = set(enabled)
    return [r for r in wanted if r in on], [r for r in wanted if r not in on]


def target_from_tags(account_id: str, region: str, cluster: str, tags: Mapping[str, str]) -> FleetTarget:
    """The manifest entry of a discovered cluster: its Prometheus from the cluster's tags
    (``rightsizer.io/prometheus-url``, ``rightsizer.io/prometheus-auth``: ``none`` or ``sigv4``, default
    ``sigv4`` for an AMP workspace URL, else ``none``)."""
    url = tags.get(TAG_PROMETHEUS_URL) or None
    auth = tags.get(TAG_PROMETHEUS_AUTH) or ("sigv4" if url and ".amazonaws.com/" in url else "none")
    return FleetTarget(
        account_id=account_id,
        region=region,
        cluster=cluster,
        prometheus_url=url,
        prometheus_auth="sigv4" if auth == "sigv4" else "none",
    )


def dedupe(targets: Iterable[FleetTarget], rules: FleetRules) -> list[FleetTarget]:
    """The admitted targets, each key once (the first wins), sorted by key: the manifest's order."""
    seen: dict[str, FleetTarget] = {}
    for target in targets:
        if target.key not in seen and rules.admits(target.key):
            seen[target.key] = target
    return [seen[k] for k in sorted(seen)]


# --------------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------------


class ClusterResult(_Frozen):
    """What one child of the fleet run reports (the Distributed Map item's output).

    ``verdicts`` counts GPU nodes per verdict; ``idle_usd_per_hour`` sums the on-demand price of the idle
    ones (unpriced nodes count 0); ``actions`` counts the plan's actions per kind (the fleet decides and
    reports; the cluster's own stack acts); ``error`` is the failure's text (secrets never reach it: the
    exception messages this package raises name no credential).
    """

    key: str
    account_id: str
    region: str
    cluster: str
    outcome: Outcome
    hint: str = ""
    verdicts: dict[str, int] = Field(default_factory=dict)
    idle_usd_per_hour: float = 0.0
    hourly_savings_usd: float = 0.0
    actions: dict[str, int] = Field(default_factory=dict)
    error: str | None = None
    duration_s: float = 0.0

    @classmethod
    def of(cls, target: FleetTarget, outcome: Outcome, error: str | None = None) -> ClusterResult:
        """A result without an assessment (every outcome but ``assessed``), with its fix hint."""
        return cls(
            key=target.key,
            account_id=target.account_id,
            region=target.region,
            cluster=target.cluster,
            outcome=outcome,
            hint=FIX_HINTS[outcome],
            error=error[:2000] if error else None,
        )


#: AWS error codes (``Error.Code``) by outcome: AssumeRole into the spoke, DescribeCluster, ListClusters.
_DENIED_CODES: Final = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError"}
)
_REGION_CODES: Final = frozenset(
    {"OptInRequired", "InvalidClientTokenId", "UnrecognizedClientException", "RegionDisabledException"}
)


class FleetError(Exception):
    """A fleet call that failed, as :func:`classify_failure` reads it (``kind``, ``code``, message)."""

    def __init__(self, kind: str, message: str, *, code: str = "") -> None:
        self.kind = kind
        self.code = code
        super().__init__(message)


def classify_failure(kind: str, code: str = "", message: str = "") -> Outcome:
    """The outcome of a child that did not finish its assessment.

    Args:
        kind: what failed, as the service names it: ``access`` (the Kubernetes API refused us: 401/403),
            ``aws`` (an AWS call's ``ClientError``, ``code`` = its ``Error.Code``), ``unreachable`` (no
            connection to the API server or Prometheus), ``metrics`` (Prometheus answered with an error),
            ``timeout`` (Step Functions' ``States.Timeout`` / Lambda's ``Sandbox.Timedout``), or anything
            else (``failed``).
        code: the AWS error code or Step Functions error name, when there is one.
        message: the error's text (region opt-in errors are told apart by it).
    """
    if kind == "timeout" or code in ("States.Timeout", "Sandbox.Timedout", "States.HeartbeatTimeout"):
        return "timeout"
    if kind == "access":
        return "access_denied"
    if kind == "unreachable":
        return "unreachable_endpoint"
    if kind == "metrics":
        return "metrics_unavailable"
    if kind == "aws":
        if code in _REGION_CODES or "not enabled" in message or "opt-in" in message.lower():
            return "region_not_enabled"
        if code in _DENIED_CODES or "not authorized" in message:
            return "access_denied"
    return "failed"


def assessed_outcome(unknown_reasons: Sequence[Sequence[str]], gpu_nodes: int) -> Outcome:
    """``metrics_unavailable`` when the cluster has GPU nodes and every one is ``unknown`` for a missing
    metric (``unknown_reasons``: the reasons of each unknown node), else ``assessed``."""
    if gpu_nodes == 0 or len(unknown_reasons) < gpu_nodes:
        return "assessed"
    if all(any(r.split(":")[0] in METRICS_REASONS for r in reasons) for reasons in unknown_reasons):
        return "metrics_unavailable"
    return "assessed"


# --------------------------------------------------------------------------------------------------
# The fleet report
# --------------------------------------------------------------------------------------------------


class FleetReport(_Frozen):
    """The fleet run's report (``s3://<bucket>/fleet/reports/latest.json``): totals and one row per
    cluster, sorted by key. ``unfinished`` lists the items the Distributed Map reports as failed without a
    result (they count as ``failed``)."""

    run_id: str
    at: str
    clusters: int
    outcomes: dict[str, int]
    verdicts: dict[str, int]
    idle_usd_per_hour: float
    hourly_savings_usd: float
    actions: dict[str, int]
    results: list[ClusterResult]


def fleet_report(run_id: str, at: str, results: Iterable[ClusterResult]) -> FleetReport:
    """Aggregate the children's results (any order, a key seen twice counts once: its last result)."""
    by_key = {r.key: r for r in results}
    rows = [by_key[k] for k in sorted(by_key)]
    outcomes: Counter[str] = Counter(r.outcome for r in rows)
    verdicts: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    for row in rows:
        verdicts.update(row.verdicts)
        actions.update(row.actions)
    return FleetReport(
        run_id=run_id,
        at=at,
        clusters=len(rows),
        outcomes=dict(sorted(outcomes.items())),
        verdicts=dict(sorted(verdicts.items())),
        idle_usd_per_hour=round(sum(r.idle_usd_per_hour for r in rows), 6),
        hourly_savings_usd=round(sum(r.hourly_savings_usd for r in rows), 6),
        actions=dict(sorted(actions.items())),
        results=rows,
    )
