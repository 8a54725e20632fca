"""``rightsizer offhours {down,up,status}``: converge node groups to their off-hours schedules, or show them."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rightsizer.cli.common import EXIT_FAILED, EXIT_OK, emit_json, parse_time, require_table
from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError
from rightsizer.render import render_offhours

log = logging.getLogger("rightsizer")

if TYPE_CHECKING:
    from rightsizer.services.offhours import OffhoursDeps


def build_offhours_deps(config: Config, *, dry_run: bool) -> OffhoursDeps:
    """The off-hours ports for ``config`` (:meth:`rightsizer.wiring.Runtime.offhours`, mode ``cli``): the
    cluster observed once per tick for the group pre-check, drains in this process (also forced ones).

    Raises:
        ConfigError: no ``cluster.name`` (node groups are EKS's) or no ``aws.table`` (saved sizes must
            outlive the process).
    """
    from rightsizer.wiring import Runtime

    runtime = Runtime(
        config,
        "cli",
        dry_run=dry_run,
        progress=lambda r: log.info("drain %s: %s %s", r.execution_id, r.step, r.message),
    )
    return runtime.offhours()


def cmd_offhours(
    args: argparse.Namespace, *, build: Callable[..., OffhoursDeps] = build_offhours_deps
) -> int:
    """``rightsizer offhours {down,up,status}``: converge the configured node groups towards their
    schedules now (``down``/``up`` act only on groups whose schedule says that direction), or show them.

    Acts only with ``--execute`` and the policy's ``dry_run: false``; ``--at`` only without ``--execute``.
    Exit 1 when a group failed or a restore is overdue.
    """
    from rightsizer.services.offhours import offhours_status, run_offhours

    if args.at and args.execute:
        raise ConfigError("--at evaluates another instant: use it for dry runs and status only", field="--at")
    config = load_config(args.config)
    now = parse_time(args.at) if args.at else datetime.now(UTC)
    if args.action == "status":
        require_table(config, "offhours status reads the state table", stack=False)
    deps = build(config, dry_run=not args.execute or args.action == "status")
    if args.action == "status":
        report = offhours_status(deps, now)
    else:
        report = run_offhours(deps, now, force=args.force, only=args.action)
    if args.json:
        emit_json(report.to_json_dict())
    else:
        print(render_offhours(report))
    return EXIT_FAILED if report.failed else EXIT_OK


def add_parsers(sub: Any) -> None:
    """Register ``offhours``."""
    o = sub.add_parser("offhours", help="scale node groups to their off-hours schedules")
    o.add_argument("action", choices=["down", "up", "status"], help="converge down / up, or show status")
    o.add_argument(
        "--config",
        metavar="FILE",
        required=True,
        help="the config file (docs/policy.md: 'Configuration file')",
    )
    o.add_argument("--force", action="store_true", help="drain busy/underutilized nodes too (never unknown)")
    o.add_argument("--execute", action="store_true", help="act (default: dry run)")
    o.add_argument("--at", metavar="TIME", help="evaluate at TIME, RFC 3339 (dry run / status only)")
    o.add_argument("--json", action="store_true", help="print the report as one JSON document")
    o.set_defaults(func=cmd_offhours)
