"""``rightsizer status | history | savings | approve | reject | snooze``: read and decide on a deployment, by its
stack (``--stack NAME``) or a config file (``--config FILE``) (docs/architecture.md §5 "CLI")."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from rightsizer.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    count_arg,
    deployed_config,
    emit_json,
    require_table,
)
from rightsizer.domain.errors import ConfigError


def cmd_savings(args: argparse.Namespace) -> int:
    """``rightsizer savings --stack NAME | --config FILE [--json]``: realized savings read back from the ledger (state
    table ``aws.table``) — instance-hours actually avoided and USD per UTC day, node group and action kind
    (``scale_in``; ``replace_node_group``: old-type instance-hours replaced, priced at the difference;
    ``rightsizer.services.realized``). Never acts."""
    from rightsizer.services.realized import realized_savings
    from rightsizer.wiring import Runtime

    config = deployed_config(args)
    require_table(config, "savings reads the state table")
    now = datetime.now(UTC)
    rows = realized_savings(Runtime(config, "cli").state.entries(), now)
    if args.json:
        emit_json(
            {
                "at": now.isoformat().replace("+00:00", "Z"),
                "days": [
                    {
                        "day": r.day.isoformat(),
                        "node_group": r.node_group,
                        "instance_hours": r.instance_hours,
                        "usd": r.usd,
                        "removals": r.removals,
                        "kind": r.kind,
                    }
                    for r in rows
                ],
                "total_usd": sum(r.usd for r in rows),
            }
        )
        return EXIT_OK
    print(f"{'day':<11} {'node group':<28} {'action':<19} {'instance-hours':>14} {'USD':>10}  actions")
    for r in rows:
        print(
            f"{r.day.isoformat():<11} {r.node_group:<28} {r.kind:<19} {r.instance_hours:>14.3f} {r.usd:>10.2f}"
            f"  {r.removals}"
        )
    print(
        f"total: {sum(r.instance_hours for r in rows):.3f} instance-hours, {sum(r.usd for r in rows):,.2f} USD"
    )
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """``rightsizer status --stack NAME | --config FILE [--json]``: the latest assessment's decision
    records, drains in flight with their step, off-hours groups with saved sizes, realized savings (per
    day, node group and action kind) and the last failures, read from the state table. Never acts."""
    from rightsizer.render import render_status
    from rightsizer.services.status import read_status
    from rightsizer.wiring import Runtime

    config = deployed_config(args)
    require_table(config, "status reads the state table")
    runtime = Runtime(config, "cli")
    report = read_status(
        runtime.state,
        runtime.plans,
        datetime.now(UTC),
        offhours_groups=[g.name for g in config.offhours.node_groups],
        failures=args.failures,
    ).to_json()
    if args.json:
        emit_json(report)
    else:
        print(render_status(report))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    """``rightsizer history --stack NAME | --config FILE [--node N] [--limit N] [--json]``: the ledger,
    newest ``--limit`` entries, oldest first. Never acts."""
    from rightsizer.render import render_history
    from rightsizer.services.status import history_rows
    from rightsizer.wiring import Runtime

    config = deployed_config(args)
    require_table(config, "history reads the state table")
    rows = history_rows(Runtime(config, "cli").state, node=args.node, limit=args.limit)
    if args.json:
        emit_json({"cluster": config.cluster.name, "entries": rows})
    else:
        print(render_history(rows))
    return EXIT_OK


def cmd_decide(args: argparse.Namespace) -> int:
    """``rightsizer approve|reject|snooze EXECUTION_ID --stack NAME | --config FILE [--for 24h] [--json]``:
    decide a drain waiting for approval with the caller's AWS credentials (DynamoDB conditional write on
    the approval request, then Step Functions SendTaskSuccess / SendTaskFailure to wake the drain). A
    snooze also keeps the node ``protected`` (``snoozed``) in plans for ``--for`` (default: the policy's
    ``approval_snooze``: the deployed stack's policy with ``--stack``, the config's with ``--config``).

    The decider recorded is the caller's AWS principal (STS ``GetCallerIdentity`` ARN), never a
    self-declared name such as ``$USER``; ``--for`` is at most ``MAX_SNOOZE_S`` (30 days), checked before
    any call.

    Exit: 0 decided; 1 decided before or expired (nothing changed); 2 no such request or bad input.
    """
    from rightsizer.domain.policy import MAX_SNOOZE_S, parse_duration
    from rightsizer.wiring import Runtime

    # without --for, the snooze lasts what the deployed policy says (its approval_snooze), read from the stack
    config = deployed_config(args, with_policy=not args.duration)
    require_table(config, f"{args.action} records the decision in the state table")
    try:
        seconds = parse_duration(args.duration) if args.duration else config.policy.approval_snooze
    except ValueError as exc:
        raise ConfigError(str(exc), field="--for") from exc
    if not 0 < seconds <= MAX_SNOOZE_S:
        raise ConfigError(
            f"{args.duration!r}: a snooze lasts more than 0s and at most {MAX_SNOOZE_S // 86400}d",
            field="--for",
        )
    runtime = Runtime(config, "cli")
    decision = runtime.approval_desk().decide(
        args.execution_id, args.action, by=f"cli:{runtime.caller_arn()}", snooze_seconds=seconds
    )
    request = decision.request
    document = {
        "execution_id": args.execution_id,
        "outcome": decision.outcome,
        "node": request.node if request else None,
        "status": request.status if request else None,
        "snooze_until": request.snooze_until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if request and request.snooze_until
        else None,
        "detail": decision.detail,
    }
    if args.json:
        emit_json(document)
    else:
        line = f"{args.execution_id}: {decision.outcome}"
        if request is not None:
            line += f" (node {request.node}" + (
                f", snoozed until {document['snooze_until']})" if document["snooze_until"] else ")"
            )
        print(line if decision.status == 200 else f"{line}: {decision.detail}")
    if decision.status == 200:
        return EXIT_OK
    return EXIT_BAD_INPUT if decision.status in (400, 404) else EXIT_FAILED


def add_deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """``(--stack NAME | --config FILE) [--region REGION]``: the deployment a command reads, one of the two
    required (argparse says so in the usage line and exits 2 without either)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--stack",
        metavar="NAME",
        help="the deployed CloudFormation stack, by name or ARN (its outputs name the cluster and table)",
    )
    where.add_argument("--config", metavar="FILE", help="or a config file with aws.table and cluster.name")
    parser.add_argument(
        "--region",
        metavar="REGION",
        help="the stack's region (default: the stack ARN's, else AWS_REGION / AWS_DEFAULT_REGION / the profile's)",
    )


def add_parsers(sub: Any) -> None:
    """Register ``savings``, ``status``, ``history``, ``approve``, ``reject`` and ``snooze``."""
    from rightsizer.cli.common import EXIT_CODES

    for name, helptext, func in (
        (
            "status",
            "what a deployment decided and did: latest plan, drains, off-hours, savings, failures",
            cmd_status,
        ),
        (
            "history",
            "the ledger of a deployment: every action and step outcome with its savings",
            cmd_history,
        ),
        ("savings", "realized savings from the ledger, per day, node group and action", cmd_savings),
    ):
        c = sub.add_parser(name, help=helptext + " (never acts)", description=helptext + " (never acts).")
        c.epilog = EXIT_CODES
        add_deployment_arguments(c)
        c.add_argument("--json", action="store_true", help="print one JSON document")
        if name == "status":
            c.add_argument(
                "--failures", type=count_arg, default=10, metavar="N", help="last N failures (default 10)"
            )
        elif name == "history":
            c.add_argument("--node", metavar="NODE", help="only this node's entries")
            c.add_argument(
                "--limit", type=count_arg, default=50, metavar="N", help="newest N entries (default 50)"
            )
        c.set_defaults(func=func)

    for action, helptext in (
        ("approve", "let a drain waiting for approval go on to its cordon"),
        ("reject", "abandon a drain waiting for approval; nothing is cordoned"),
        ("snooze", "reject, and keep the node out of plans for a while (--for)"),
    ):
        a = sub.add_parser(
            action,
            help=helptext + " (with your AWS credentials)",
            description=helptext + " (with your AWS credentials).",
        )
        a.epilog = (
            "exit codes: 0 decided; 1 decided before or expired (nothing changed), or another failure; "
            "2 no such request, or a usage or configuration error"
        )
        a.add_argument("execution_id", metavar="EXECUTION_ID", help="the drain execution (in the request)")
        add_deployment_arguments(a)
        a.add_argument("--json", action="store_true", help="print one JSON document")
        if action == "snooze":
            a.add_argument(
                "--for",
                dest="duration",
                metavar="DURATION",
                help="e.g. 24h (default: the deployed policy's approval_snooze)",
            )
        a.set_defaults(func=cmd_decide, action=action, duration=None)
