"""``rightsizer fleet plan|status`` (issue 31, docs/fleet.md): assess a manifest of clusters from this
machine, or read the deployed fleet's latest report. Never acts.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rightsizer.cli.common import EXIT_FAILED, EXIT_OK, count_arg, parse_time, read_policy_file
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.fleet import ClusterResult, FleetReport, FleetRules, FleetTarget, fleet_report
from rightsizer.domain.policy import Policy
from rightsizer.domain.validation import config_error


def _concurrency(text: str) -> int:
    """argparse type of ``--concurrency``: 1 to 64 clusters at once (argparse exits 2 naming the option)."""
    value = count_arg(text)
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{value} is not 1 to 64 clusters at once")
    return value


def _load_manifest(path: str) -> list[FleetTarget]:
    """The manifest file: a JSON or YAML list of entries (``domain.fleet.FleetTarget``).

    Raises:
        ConfigError: unreadable, not a list, or an entry's field is wrong (names the entry and field).
    """
    from rightsizer.services.fleet import operator_manifest

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the manifest: {exc}", source=path) from exc
    try:
        targets = operator_manifest(raw, FleetRules())
    except ValidationError as exc:
        raise config_error(exc, source=path, model=FleetTarget) from exc  # entry index, field, value, fix
    except ValueError as exc:
        raise ConfigError(str(exc), source=path) from exc
    if not targets:
        raise ConfigError("lists no cluster: add {account_id, region, cluster} entries", source=path)
    return targets


def _table(report: FleetReport) -> str:
    lines = [
        f"{'cluster (account/region/name)':<48} {'outcome':<21} {'GPU nodes':>9} {'idle':>5} "
        f"{'idle USD/h':>11}  actions"
    ]
    for row in report.results:
        nodes = sum(row.verdicts.values())
        actions = ",".join(f"{k}:{v}" for k, v in row.actions.items()) or "-"
        lines.append(
            f"{row.key:<48} {row.outcome:<21} {nodes:>9} {row.verdicts.get('idle', 0):>5} "
            f"{row.idle_usd_per_hour:>11.2f}  {actions}"
        )
    lines.append(
        f"{report.clusters} clusters: "
        + ", ".join(f"{k} {v}" for k, v in report.outcomes.items())
        + f"; idle {report.idle_usd_per_hour:.2f} USD/h, plan saves {report.hourly_savings_usd:.2f} USD/h"
    )
    hints = [r for r in report.results if r.outcome != "assessed"]
    for row in hints:
        lines.append(f"  {row.key}: {row.outcome}: {row.error or ''}\n    fix: {row.hint}")
    return "\n".join(lines)


def _print(report: FleetReport, as_json: bool) -> int:
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        print(_table(report))
    return EXIT_OK if all(r.outcome == "assessed" for r in report.results) else EXIT_FAILED


def cmd_fleet_plan(args: argparse.Namespace) -> int:
    """Assess every manifest entry from this machine, ``--concurrency`` at a time, and print the fleet
    table (or ``--json``: the fleet report). An entry with ``context`` is reached through that kubeconfig
    context; otherwise through EKS authentication, under the entry's ``role_arn``, else ``--role-name`` in
    its account (with ``--external-id``), else the caller's own credentials.

    Exit codes: 0 every cluster assessed; 1 at least one other outcome (each with its fix hint);
    2 a bad manifest or policy (``ConfigError``, handled by the caller).
    """
    from rightsizer.wiring.fleet import assess_member, member_config

    targets = _load_manifest(args.manifest)
    policy = Policy() if args.policy is None else read_policy_file(args.policy)
    at = datetime.now(UTC) if args.at is None else parse_time(args.at)

    def one(target: FleetTarget) -> ClusterResult:
        def config_for(t: FleetTarget) -> Any:
            return member_config(
                t,
                policy,
                role_name=args.role_name,
                external_id=args.external_id,
                kubeconfig=args.kubeconfig,
                pricing_api=not args.no_price_list_api,
            )

        return assess_member(target, at, config_for)

    with ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="fleet") as pool:
        results = list(pool.map(one, targets))
    run_id = "local-" + at.strftime("%Y%m%dT%H%M%SZ")
    return _print(fleet_report(run_id, at.isoformat(), results), args.json)


def cmd_fleet_status(args: argparse.Namespace) -> int:
    """Print the deployed fleet's latest report (``fleet/reports/latest.json`` in the stack's
    ``FleetBucketName``). Exit codes as ``fleet plan``; 2 when the stack has no fleet or no report yet."""
    from rightsizer.wiring.fleet import report_of_stack

    return _print(report_of_stack(args.stack, args.region), args.json)


def add_parsers(sub: Any) -> None:
    """Register ``fleet plan`` and ``fleet status`` on the ``rightsizer`` sub-command parsers."""
    fleet = sub.add_parser("fleet", help="many clusters: assess a manifest, or read the fleet report")
    verbs = fleet.add_subparsers(dest="fleet_command", required=True)
    p = verbs.add_parser("plan", help="assess every cluster of a manifest from here (never acts)")
    p.add_argument(
        "--manifest", metavar="FILE", required=True, help="JSON/YAML list of clusters (docs/fleet.md)"
    )
    p.add_argument("--policy", metavar="FILE", help="the decision policy (default: the defaults)")
    p.add_argument("--role-name", help="the spoke role to assume in each entry's account (default: none)")
    p.add_argument("--external-id", help="the ExternalId the spoke role asks for")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig of the entries' contexts")
    p.add_argument(
        "--no-price-list-api",
        action="store_true",
        help="price from the packaged catalog (no pricing:GetProducts)",
    )
    p.add_argument("--concurrency", type=_concurrency, default=4, metavar="N", help="1-64")
    p.add_argument("--at", metavar="TIME", help="RFC 3339 instant to decide at (default: now)")
    p.add_argument("--json", action="store_true", help="print the fleet report as one JSON document")
    p.set_defaults(func=cmd_fleet_plan)
    s = verbs.add_parser("status", help="the deployed fleet's latest report")
    s.add_argument("--stack", metavar="NAME", required=True, help="the hub stack (EnableFleet=true)")
    s.add_argument("--region", help="the stack's region (default: the AWS configuration's)")
    s.add_argument("--json", action="store_true", help="print the report as one JSON document")
    s.set_defaults(func=cmd_fleet_status)
