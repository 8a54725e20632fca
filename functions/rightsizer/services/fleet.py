"""The fleet's three steps (issue 31, docs/fleet.md): discover the clusters into a manifest, assess one
cluster (a Distributed Map child), and summarise the children's results into the fleet report.

Each step runs once per fleet run or once per cluster — nothing here loops over steps or invokes itself, so
Lambda invocations and state transitions per run are O(clusters). A child never raises: whatever fails in
one cluster becomes that cluster's outcome with its fix hint, and the other children go on.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from rightsizer.domain.decisions import DecisionRecord, decision_records
from rightsizer.domain.fleet import (
    ANY_CLUSTER,
    FIX_HINTS,
    ClusterResult,
    FleetError,
    FleetReport,
    FleetRules,
    FleetTarget,
    assessed_outcome,
    classify_failure,
    dedupe,
    fleet_report,
    regions_to_scan,
    target_from_tags,
)
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy

log = logging.getLogger(__name__)

MANIFEST_PREFIX = "fleet/manifests/"
REPORT_PREFIX = "fleet/reports/"
LATEST_REPORT = REPORT_PREFIX + "latest.json"


class DiscoveredClusterLike(Protocol):
    """A cluster as a spoke lists it: name and tags."""

    @property
    def name(self) -> str: ...

    @property
    def tags(self) -> dict[str, str]: ...


class SpokeView(Protocol):
    """One account seen through its spoke role (``adapters.fleet_aws.SpokeInventory``)."""

    def enabled_regions(self, home_region: str) -> list[str]: ...

    def clusters(self, region: str) -> Iterable[DiscoveredClusterLike]: ...


class JsonStore(Protocol):
    """The fleet bucket (``adapters.fleet_aws.FleetBucket``)."""

    bucket: str

    def put_json(self, key: str, document: Any) -> None: ...

    def get_json(self, key: str) -> Any: ...


# --------------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------------


def _skipped(account: str, region: str, error: FleetError) -> FleetTarget:
    outcome = classify_failure(error.kind, error.code, str(error))
    return FleetTarget(account_id=account, region=region, cluster=ANY_CLUSTER, skip=outcome)


def discover(
    accounts: Sequence[str],
    spoke: Callable[[str], SpokeView],
    regions: Sequence[str],
    rules: FleetRules,
    home_region: str,
) -> list[FleetTarget]:
    """Every (account, region, cluster) of ``accounts`` × ``regions`` the rules admit, sorted by key.

    An account whose spoke role cannot be assumed, a region not enabled in the account and a region whose
    clusters cannot be listed become one entry each with cluster ``*`` and the outcome (``access_denied``,
    ``region_not_enabled``…) in ``skip``, so the report names them instead of silently skipping them.
    """
    found: list[FleetTarget] = []
    for account in accounts:
        try:
            view = spoke(account)
            enabled = view.enabled_regions(home_region)
        except FleetError as exc:
            log.warning("fleet discovery: account %s: %s", account, exc)
            found.append(_skipped(account, home_region, exc))
            continue
        scan, off = regions_to_scan(regions, enabled)
        found += [
            FleetTarget(account_id=account, region=r, cluster=ANY_CLUSTER, skip="region_not_enabled")
            for r in off
        ]
        for region in scan:
            try:
                found += [target_from_tags(account, region, c.name, c.tags) for c in view.clusters(region)]
            except FleetError as exc:
                log.warning("fleet discovery: %s/%s: %s", account, region, exc)
                found.append(_skipped(account, region, exc))
    return dedupe(found, rules)


def operator_manifest(document: Any, rules: FleetRules) -> list[FleetTarget]:
    """The operator's manifest (a JSON list of :class:`FleetTarget` entries), filtered by the rules.

    Raises:
        pydantic.ValidationError: an entry is malformed (names the entry's index and field).
    """
    if not isinstance(document, list):
        raise ValueError("a fleet manifest is a JSON list of {account_id, region, cluster, ...} entries")
    from pydantic import TypeAdapter

    # validated as one list, so an error's location starts with the entry's index
    return dedupe(TypeAdapter(list[FleetTarget]).validate_python(document), rules)


@dataclass(frozen=True)
class ManifestRef:
    """Where a run's manifest is (the Distributed Map's ItemReader reads it) and how many entries it has."""

    bucket: str
    key: str
    count: int


def write_manifest(store: JsonStore, run_id: str, targets: Sequence[FleetTarget]) -> ManifestRef:
    """Write the run's manifest to ``fleet/manifests/<run_id>.json`` (a JSON array, ItemReader ``JSON``)."""
    key = f"{MANIFEST_PREFIX}{run_id}.json"
    store.put_json(key, [t.model_dump(mode="json", exclude_none=True) for t in targets])
    return ManifestRef(store.bucket, key, len(targets))


# --------------------------------------------------------------------------------------------------
# One cluster (a Distributed Map child)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterAssessment:
    """One cluster decided: GPU nodes per verdict, one decision record per GPU node, the plan's actions per
    kind and its savings (USD per hour)."""

    verdicts: dict[str, int]
    records: list[DecisionRecord]
    actions: dict[str, int]
    hourly_savings_usd: float


def assess_snapshot(
    snapshot: ClusterSnapshot, policy: Policy, at: datetime, cluster: str, node_label: str | None
) -> ClusterAssessment:
    """The single-cluster decision (``domain.planner.plan``) on a fresh observation, read only.

    The fleet never heals, cordons or starts anything: a cluster's own stack holds its leases and acts, so a
    cordon of that stack is never mistaken for a stale one here (no ``stale_cordons``: every cordon of ours
    counts as in flight, the cautious side of the budget).
    """
    result = plan(snapshot, policy, at, node_label=node_label)
    return ClusterAssessment(
        verdicts=dict(sorted(Counter(r.verdict for r in result.nodes).items())),
        records=decision_records(result, cluster, started={}, skipped={}),
        actions=dict(sorted(Counter(a.kind for a in result.actions).items())),
        hourly_savings_usd=result.savings.hourly_usd,
    )


def assess_target(
    target: FleetTarget,
    assess: Callable[[FleetTarget], ClusterAssessment],
    explain: Callable[[Exception], tuple[str, str]],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> ClusterResult:
    """Assess one cluster and say what became of it; never raises.

    Args:
        assess: runs the single-cluster assessment for the target (``wiring.fleet``: under the spoke role).
        explain: names a failure for :func:`classify_failure`: (kind, AWS error code or "").
    """
    if target.skip is not None:
        return ClusterResult.of(target, target.skip)
    if not target.prometheus_url:
        return ClusterResult.of(
            target, "metrics_unavailable", "no Prometheus URL: no rightsizer.io/prometheus-url tag or entry"
        )
    began = clock()
    try:
        summary = assess(target)
    except Exception as exc:  # one cluster's failure is its outcome, never the fleet's
        kind, code = explain(exc)
        outcome = classify_failure(kind, code, str(exc))
        log.warning("fleet: %s: %s (%s)", target.key, outcome, exc)
        return ClusterResult.of(target, outcome, f"{type(exc).__name__}: {exc}").model_copy(
            update={"duration_s": clock() - began}
        )
    records = summary.records
    unknown = [r.reasons for r in records if r.verdict == "unknown"]
    outcome = assessed_outcome(unknown, len(records))
    return ClusterResult(
        key=target.key,
        account_id=target.account_id,
        region=target.region,
        cluster=target.cluster,
        outcome=outcome,
        hint=FIX_HINTS[outcome],
        verdicts=dict(summary.verdicts),
        idle_usd_per_hour=round(sum(r.hourly_usd or 0.0 for r in records if r.verdict == "idle"), 6),
        hourly_savings_usd=summary.hourly_savings_usd,
        actions=summary.actions,
        duration_s=round(clock() - began, 3),
    )


# --------------------------------------------------------------------------------------------------
# The fleet report
# --------------------------------------------------------------------------------------------------


def child_result(output: Any) -> ClusterResult:
    """A child's output: a :class:`ClusterResult`, or ``{"target", "error": {"Error", "Cause"}}`` when the
    state machine caught the child's task failing (Lambda timeout, crash): classified from the error."""
    if isinstance(output, dict) and "error" in output and "target" in output:
        target = FleetTarget.model_validate(output["target"])
        error = output["error"] or {}
        name, cause = str(error.get("Error", "")), str(error.get("Cause", ""))
        return ClusterResult.of(target, classify_failure("", name, cause), f"{name}: {cause}")
    return ClusterResult.model_validate(output)


def _result_files(store: JsonStore, manifest_key: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The ResultWriter's files: (status, records) per file listed in its ``manifest.json``."""
    manifest = store.get_json(manifest_key)
    for status, files in (manifest.get("ResultFiles") or {}).items():
        for entry in files:
            yield status, store.get_json(entry["Key"])


def results_of_map_run(store: JsonStore, manifest_key: str) -> list[ClusterResult]:
    """Every child's result, from the Distributed Map's ResultWriter output (``manifest.json`` and its
    ``SUCCEEDED_n.json`` / ``FAILED_n.json`` files): a failed child is classified from its Error/Cause."""
    results: list[ClusterResult] = []
    for status, records in _result_files(store, manifest_key):
        for record in records:
            if status == "SUCCEEDED" and record.get("Output"):
                results.append(child_result(json.loads(record["Output"])))
                continue
            item = json.loads(record.get("Input") or "{}")
            target = FleetTarget.model_validate(item.get("target", item))
            name, cause = str(record.get("Error") or status), str(record.get("Cause") or "")
            results.append(ClusterResult.of(target, classify_failure("", name, cause), f"{name}: {cause}"))
    return results


def summarize(
    store: JsonStore,
    run_id: str,
    at: str,
    manifest: ManifestRef,
    result_manifest_key: str | None,
    map_error: str | None = None,
) -> FleetReport:
    """Write the fleet report of a run (``fleet/reports/<run_id>.json`` and ``latest.json``).

    A manifest entry without a child result (the Map run failed before reaching it: ``map_error``) is
    reported as ``failed`` with that error, so the report always lists every entry of the manifest.
    """
    results = results_of_map_run(store, result_manifest_key) if result_manifest_key else []
    seen = {r.key for r in results}
    for entry in store.get_json(manifest.key):
        target = FleetTarget.model_validate(entry)
        if target.key not in seen:
            results.append(ClusterResult.of(target, "failed", map_error or "no result from the map run"))
    report = fleet_report(run_id, at, results)
    document = report.model_dump(mode="json")
    store.put_json(f"{REPORT_PREFIX}{run_id}.json", document)
    store.put_json(LATEST_REPORT, document)
    return report
