"""The ``rightsizer`` command line (docs/architecture.md §5 "CLI").

Logs go to stderr; ``--json`` prints exactly one JSON document on stdout. Exit codes: 0 success, 1 an
action failed or another failure, 2 bad input or configuration (stderr names the file and the field).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rightsizer import logsafety
from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.cli_prices import add_prices_parser
from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError, RightsizerError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.planner import plan as make_plan
from rightsizer.domain.policy import Policy, load_policy
from rightsizer.render import render_offhours, render_plan

if TYPE_CHECKING:
    from rightsizer.services.drain import StepResult

log = logging.getLogger("rightsizer")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 time with an offset (``2026-11-02T10:00:00Z``).

    Raises:
        ConfigError: when the text is not RFC 3339 or has no offset.
    """
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(f"{text!r} is not an RFC 3339 time", field="--at") from exc
    if value.tzinfo is None:
        raise ConfigError(f"{text!r} has no UTC offset (use e.g. 2026-11-02T10:00:00Z)", field="--at")
    return value


def read_policy_file(path: str | Path) -> Policy:
    """Load a policy YAML/JSON file.

    Raises:
        ConfigError: missing file, invalid YAML, or a key/value the policy rejects (named).
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(p)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=str(p)) from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError("a policy is a mapping of keys to values", source=str(p))
    return load_policy(data, source=str(p))


def example_snapshot_dir(name: str = "demo") -> Path:
    """The packaged example snapshot ``name`` (``rightsizer/data/examples/<name>``)."""
    return Path(str(resources.files("rightsizer") / "data" / "examples" / name))


def cmd_plan(args: argparse.Namespace) -> int:
    """``rightsizer plan``: decide on a snapshot directory or on live observations; never acts."""
    at = parse_time(args.at) if args.at else None
    if args.config:
        config = load_config(args.config)
        policy = read_policy_file(args.policy) if args.policy else config.policy
        snapshot = _observe_live(config, policy, at)
    else:
        policy = read_policy_file(args.policy) if args.policy else Policy()
        snapshot = load_snapshot(args.snapshot)  # node_label: the one snapshot.json records
    result = make_plan(snapshot, policy, at)
    if args.json:
        _emit_json(result.to_json_dict())
    else:
        print(render_plan(result))
    return EXIT_OK


def _now_on_step(step_seconds: int) -> datetime:
    """Now, floored to a multiple of the query step: range points and subquery points then coincide,
    so a snapshot and a live plan of the same instant see the same samples."""
    now = int(datetime.now(UTC).timestamp())
    return datetime.fromtimestamp(now - now % step_seconds, UTC)


def _observe_live(config: Config, policy: Policy, at: datetime | None) -> ClusterSnapshot:
    """Observe the configured cluster at ``at`` (default now) into an in-memory ``ClusterSnapshot``
    whose GPU signals are aggregated in Prometheus (``collect_live``)."""
    from rightsizer.wiring import PolicyProvider, Runtime

    runtime = Runtime(config, "cli", policy=PolicyProvider.fixed(policy))
    return runtime.observe_fresh(at or _now_on_step(config.prometheus.step), floor=False)


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``rightsizer snapshot``: record the live cluster as a snapshot directory (docs/architecture.md §5); never acts.

    Lists are read page by page and written object by object, metrics answers one at a time: memory does
    not grow with the number of objects (docs/architecture.md §8).
    """
    from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter, require_free_output
    from rightsizer.services.snapshot import record
    from rightsizer.wiring import Runtime, observe_request

    config = load_config(args.config)
    at = parse_time(args.at) if args.at else _now_on_step(config.prometheus.step)
    require_free_output(args.out)  # refuse bad input before contacting anything; the writer re-checks
    request = observe_request(config, config.policy, at)
    observers = Runtime(config, "cli").observers
    # The policy's node_selector keys stay on the nodes, so the snapshot selects the nodes it selected.
    keep = tuple(config.policy.node_selector)
    with SnapshotDirectoryWriter(
        args.out, policy_node_labels=keep, node_label=config.prometheus.node_label
    ) as writer:
        record(observers.cluster, observers.inventory, observers.metrics, request, writer)
        counts = writer.counts()
        out = writer.commit()
    log.info(
        "snapshot of %s at %s: %d nodes, %d pods -> %s",
        request.cluster,
        request.at,
        counts.get("nodes.json", 0),
        counts.get("pods.json", 0),
        out,
    )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``rightsizer demo``: the whole loop on the embedded default (docs/architecture.md §7), on 127.0.0.1
    only: assessment → plan table → drain with live progress → targeted scale-in on moto → sizes, ledger and
    savings → an off-hours down/up cycle.

    Raises:
        ConfigError: the ``[demo]`` extra (moto's server) is not installed: exit 2 saying what to install.
    """
    import importlib.util

    missing = [name for name in ("moto", "flask") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"the demo needs the [demo] extra: pip install gpu-rightsizer[demo] (missing: {', '.join(missing)})"
        )
    from rightsizer.demo import run_demo

    return run_demo(json_output=args.json)


# --------------------------------------------------------------------------------------------------
# rightsizer apply: plan live, then one workflow per scale_in, resize_instance and replace_node_group, in process
# --------------------------------------------------------------------------------------------------


def cmd_apply(args: argparse.Namespace) -> int:
    """``rightsizer apply --config FILE [--policy FILE] [--execute]``: plan the live cluster and run one
    drain workflow per ``scale_in`` action, one resize workflow per ``resize_instance`` action (an
    opted-in standalone instance, ``rightsizer.services.resize``) and one replacement per ``replace_node_group``
    action (an opted-in managed node group, ``rightsizer.services.replace``) in this process, with progress on
    stderr. Acts only with
    ``--execute`` and the policy's ``dry_run: false``; otherwise each workflow validates and records what
    it would do. Exit 1 when a workflow failed or was rolled back (docs/architecture.md §5)."""
    from rightsizer.services.assess import run_assessment
    from rightsizer.wiring import Runtime

    config = load_config(args.config)
    if args.policy:
        config = config.model_copy(update={"policy": read_policy_file(args.policy)})
    runtime = Runtime(config, "cli", dry_run=not args.execute, progress=_print_progress)
    dry_run = runtime.effective_dry_run()
    runner = runtime.runner()
    summary = run_assessment(
        runtime.assessment(starter=runner), datetime.now(UTC), f"apply-{uuid.uuid4().hex[:12]}"
    )
    finals = {eid: runner.results.get(eid) for eid in summary.started}
    document = summary.to_json()
    # The plan says whether the policy allows acting; without --execute nothing is executed either.
    document["dry_run"] = dry_run
    document["workflows"] = {
        eid: {"status": r.status if r else "not_run", "message": r.message if r else ""}
        for eid, r in finals.items()
    }
    if args.json:
        _emit_json(document)
    else:
        print(
            f"apply ({'dry run' if dry_run else 'EXECUTE'}): verdicts {summary.verdicts}, {len(finals)} drain(s)"
        )
        for eid, r in finals.items():
            print(f"  {eid}: {r.status if r else 'not run'} {r.message if r else ''}")
    failed = [r for r in finals.values() if r is None or r.status in ("failed", "rolled_back")]
    return EXIT_FAILED if failed else EXIT_OK


def cmd_savings(args: argparse.Namespace) -> int:
    """``rightsizer savings --config FILE [--json]``: realized savings read back from the ledger (state
    table ``aws.table``) — instance-hours actually avoided and USD per UTC day, node group and action kind
    (``scale_in``; ``replace_node_group``: old-type instance-hours replaced, priced at the difference;
    ``rightsizer.services.realized``). Never acts."""
    from rightsizer.services.realized import realized_savings
    from rightsizer.wiring import Runtime

    config = load_config(args.config)
    now = datetime.now(UTC)
    rows = realized_savings(Runtime(config, "cli").state.entries(), now)
    if args.json:
        _emit_json(
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


def _deployed_config(args: argparse.Namespace) -> Config:
    """``--stack NAME`` (the stack's outputs and parameters) or ``--config FILE``.

    Raises:
        ConfigError: neither or both given, a missing stack or output, an invalid config file.
    """
    from rightsizer.wiring import config_from_stack

    if bool(args.stack) == bool(args.config):
        raise ConfigError("give exactly one of --stack NAME or --config FILE", field="--stack")
    if args.stack:
        return config_from_stack(args.stack, args.region)
    return load_config(args.config)


def count_arg(text: str) -> int:
    """argparse type for a count of rows (``--failures``, ``--limit``): an integer ≥ 0.

    Raises:
        argparse.ArgumentTypeError: for anything else (argparse then exits 2 naming the option).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give a count of 0 or more")
    return value


def port_arg(text: str) -> int:
    """argparse type for a TCP port (``serve --port``): 0 (any free port) to 65535.

    Raises:
        argparse.ArgumentTypeError: for anything else (argparse then exits 2 naming the option).
    """
    value = count_arg(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535)")
    return value


def percent_arg(text: str) -> float:
    """argparse type for a percentage (``backtest --activity-threshold``): a finite number in [0, 100].

    Raises:
        argparse.ArgumentTypeError: for anything else, ``nan`` and ``inf`` included.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 100.0:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage from 0 to 100")
    return value


def cmd_status(args: argparse.Namespace) -> int:
    """``rightsizer status --stack NAME | --config FILE [--json]``: the latest assessment's decision
    records, drains in flight with their step, off-hours groups with saved sizes, realized savings (per
    day, node group and action kind) and the last failures, read from the state table. Never acts."""
    from rightsizer.render import render_status
    from rightsizer.services.status import read_status
    from rightsizer.wiring import Runtime

    config = _deployed_config(args)
    runtime = Runtime(config, "cli")
    report = read_status(
        runtime.state,
        runtime.plans,
        datetime.now(UTC),
        offhours_groups=[g.name for g in config.offhours.node_groups],
        failures=args.failures,
    ).to_json()
    if args.json:
        _emit_json(report)
    else:
        print(render_status(report))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    """``rightsizer history --stack NAME | --config FILE [--node N] [--limit N] [--json]``: the ledger,
    newest ``--limit`` entries, oldest first. Never acts."""
    from rightsizer.render import render_history
    from rightsizer.services.status import history_rows
    from rightsizer.wiring import Runtime

    config = _deployed_config(args)
    rows = history_rows(Runtime(config, "cli").state, node=args.node, limit=args.limit)
    if args.json:
        _emit_json({"cluster": config.cluster.name, "entries": rows})
    else:
        print(render_history(rows))
    return EXIT_OK


def cmd_decide(args: argparse.Namespace) -> int:
    """``rightsizer approve|reject|snooze EXECUTION_ID --stack NAME | --config FILE [--for 24h] [--json]``:
    decide a drain waiting for approval with the caller's AWS credentials (DynamoDB conditional write on
    the approval request, then Step Functions SendTaskSuccess / SendTaskFailure to wake the drain). A
    snooze also keeps the node ``protected`` (``snoozed``) in plans for ``--for`` (default: the policy's
    ``approval_snooze``, 24 h).

    The decider recorded is the caller's AWS principal (STS ``GetCallerIdentity`` ARN), never a
    self-declared name such as ``$USER``; ``--for`` is at most ``MAX_SNOOZE_S`` (30 days), checked before
    any call.

    Exit: 0 decided; 1 decided before or expired (nothing changed); 2 no such request or bad input.
    """
    from rightsizer.domain.policy import MAX_SNOOZE_S, parse_duration
    from rightsizer.wiring import Runtime

    config = _deployed_config(args)
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
        _emit_json(document)
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


def cmd_validate(args: argparse.Namespace) -> int:
    """``rightsizer validate [--config FILE] [--policy FILE] [--samconfig FILE --template FILE]``: check a
    config, a policy and the parameters a ``sam deploy`` would use, before anything is deployed
    (``rightsizer.deploycheck``). Prints every problem on stderr; exit 2 when there is one. Never acts."""
    from rightsizer.deploycheck import check_deployment, check_offhours, samconfig_overrides
    from rightsizer.domain.policy import MAX_APPROVAL_TIMEOUT_S
    from rightsizer.wiring.settings import STATE_MACHINE_MARGIN_S, STATE_MACHINE_TIMEOUT_S

    if not (args.config or args.policy or args.samconfig):
        raise ConfigError("give --config FILE, --policy FILE and/or --samconfig FILE", field="validate")
    problems: list[str] = []
    checked: list[str] = []
    policies: list[tuple[str, Policy]] = []
    for label, load in (("config", load_config), ("policy", read_policy_file)):
        path = getattr(args, label)
        if not path:
            continue
        try:
            loaded = load(path)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        checked.append(str(path))
        if isinstance(loaded, Config):
            problems += check_offhours(loaded.offhours, f"{path}: offhours")
            policies.append((f"{path}: policy", loaded.policy))
        else:
            policies.append((str(path), loaded))
    for source, policy in policies:
        if policy.drain_timeout + STATE_MACHINE_MARGIN_S + MAX_APPROVAL_TIMEOUT_S > STATE_MACHINE_TIMEOUT_S:
            problems.append(
                f"{source}: drain_timeout: {policy.drain_timeout}s leaves less than {STATE_MACHINE_MARGIN_S}s "
                f"of the drain state machine's {STATE_MACHINE_TIMEOUT_S}s timeout"
            )
    if args.samconfig:
        try:
            overrides = samconfig_overrides(Path(args.samconfig), args.environment)
            problems += check_deployment(Path(args.template), overrides, source=args.samconfig)
            checked.append(f"{args.samconfig} against {args.template}")
        except ConfigError as exc:
            problems.append(str(exc))
    for problem in problems:
        print(f"rightsizer: invalid: {problem}", file=sys.stderr)
    if problems:
        return EXIT_BAD_INPUT
    for name in checked:
        print(f"ok: {name}")
    return EXIT_OK


def _print_progress(result: StepResult) -> None:
    print(
        f"drain {result.execution_id}: {result.step} -> {result.next_step or result.status} {result.message}",
        file=sys.stderr,
        flush=True,
    )


# --------------------------------------------------------------------------------------------------
# rightsizer serve: the webhook Lambda handler behind a local HTTP server
# --------------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """``rightsizer serve``: answer Alertmanager webhooks on 127.0.0.1 until interrupted (Ctrl-C)."""
    from rightsizer.localserve import build_webhook_server

    config = load_config(args.config)
    server = build_webhook_server(config, port=args.port, execute=args.execute)
    log.info("serve: Alertmanager webhook on %s (%s)", server.url, "execute" if args.execute else "dry run")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("serve: interrupted")
    finally:
        server.server_close()
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# rightsizer offhours {down,up,status}
# --------------------------------------------------------------------------------------------------

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
    deps = build(config, dry_run=not args.execute or args.action == "status")
    if args.action == "status":
        report = offhours_status(deps, now)
    else:
        report = run_offhours(deps, now, force=args.force, only=args.action)
    if args.json:
        _emit_json(report.to_json_dict())
    else:
        print(render_offhours(report))
    return EXIT_FAILED if report.failed else EXIT_OK


# --------------------------------------------------------------------------------------------------
# rightsizer backtest: price policies on history before turning them on (never acts)
# --------------------------------------------------------------------------------------------------


def _backtest_time(text: str, flag: str) -> datetime:
    try:
        return parse_time(text)
    except ConfigError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], field=flag) from exc


def _backtest_source(args: argparse.Namespace) -> tuple[Any, Config | None]:
    """The history to replay (``rightsizer.backtest.simulate.Source``) and the config when one was read."""
    from rightsizer.backtest import sources

    if args.trace:
        return sources.read_trace(args.trace, instance_type=args.instance_type or "g5.xlarge"), None
    if args.snapshot_series:
        from rightsizer.backtest.snapshot_series import read_snapshot_series

        return read_snapshot_series(args.snapshot_series), None
    if not args.config:
        raise ConfigError("--prometheus needs --config FILE", field="--config")
    if not args.from_time or not args.to_time:
        raise ConfigError("--prometheus needs --from TIME and --to TIME", field="--from")
    config = load_config(args.config)
    from rightsizer.wiring import build_metrics_reader

    client = build_metrics_reader(config)
    try:
        source = sources.fetch_prometheus_history(
            client,
            start=_backtest_time(args.from_time, "--from"),
            end=_backtest_time(args.to_time, "--to"),
            step=int(config.prometheus.step),
            cluster=str(config.cluster.name or config.cluster.context),
            region=config.cluster.region or config.aws.region,
            node_label=config.prometheus.node_label,
            job=config.prometheus.job,
            instance_type=args.instance_type,
        )
    finally:
        client.close()
    return source, config


def cmd_backtest(args: argparse.Namespace) -> int:
    """``rightsizer backtest``: replay history through the same ``plan()`` for each policy, beside the
    request-based and naive-threshold baselines and the oracle; never acts."""
    from rightsizer.backtest.report import (
        SCALE_TO_ZERO,
        BacktestRequest,
        NamedPolicy,
        Sweep,
        parse_seconds,
        render_report,
        report_json,
        run_backtest,
        scale_to_zero_policy,
    )
    from rightsizer.backtest.simulate import SimModel

    sweep = Sweep.parse(args.sweep) if args.sweep else None
    model = SimModel(
        step=parse_seconds(args.step, "--step"),
        provision_delay=parse_seconds(args.provision_delay, "--provision-delay"),
        regret_horizon=parse_seconds(args.regret_horizon, "--regret-horizon"),
        activity_threshold_pct=float(args.activity_threshold),
    )
    if model.step <= 0:
        raise ConfigError("the step must be positive", field="--step")
    source, config = _backtest_source(args)
    policies: list[NamedPolicy] = []
    base: str | None = None
    if source.kind == "trace":
        # The trace's pods hold their GPUs: the default policy protects them (saves nothing, by design);
        # scale-to-zero is the policy this trace can price.
        policies += [NamedPolicy("default", Policy()), NamedPolicy(SCALE_TO_ZERO, scale_to_zero_policy())]
        base = SCALE_TO_ZERO
    else:
        policies.append(NamedPolicy("config" if config else "default", config.policy if config else Policy()))
        base = policies[0].name
    for path in args.policy or []:
        name = Path(path).stem
        taken = {p.name for p in policies}
        suffix = 2
        while name in taken:
            name, suffix = f"{Path(path).stem}-{suffix}", suffix + 1
        policies.append(NamedPolicy(name, read_policy_file(path)))
        base = name
    report = run_backtest(source, BacktestRequest(tuple(policies), model, sweep, base))
    if args.plot:
        from rightsizer.backtest.plot import plot_report

        log.info("plot written to %s", plot_report(report, args.plot))
    if args.json:
        _emit_json(report_json(report))
    else:
        print(render_report(report))
    return EXIT_OK


def _add_backtest_parser(sub: Any) -> None:
    b = sub.add_parser("backtest", help="price policies on history before turning them on (never acts)")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prometheus", action="store_true", help="DCGM and kube-state-metrics history from --config"
    )
    src.add_argument("--snapshot-series", metavar="DIR", help="directory of snapshots named by RFC 3339 time")
    src.add_argument("--trace", metavar="FILE", help="per-pod GPU utilisation trace (Alibaba GenAI 2026 CSV)")
    b.add_argument("--config", metavar="FILE", help="config file (with --prometheus)")
    b.add_argument("--from", dest="from_time", metavar="TIME", help="start, RFC 3339 (with --prometheus)")
    b.add_argument("--to", dest="to_time", metavar="TIME", help="end, RFC 3339 (with --prometheus)")
    b.add_argument("--policy", metavar="FILE", action="append", help="a policy to price (repeatable)")
    b.add_argument("--sweep", metavar="KEY=V1,V2", help="vary one policy key, e.g. idle_window=10m,30m")
    b.add_argument("--step", default="5m", help="decision step (default 5m)")
    b.add_argument("--provision-delay", default="5m", help="time to add a node back (default 5m)")
    b.add_argument("--regret-horizon", default="30m", help="a removal regrets within this (default 30m)")
    b.add_argument(
        "--activity-threshold", type=percent_arg, default=5.0, metavar="PCT", help="active above (default 5)"
    )
    b.add_argument(
        "--instance-type",
        metavar="TYPE",
        help="trace nodes' type (default g5.xlarge); Prometheus nodes without a type label",
    )
    b.add_argument("--json", action="store_true", help="print the report as one JSON document")
    b.add_argument("--plot", metavar="FILE.png", help="draw activity, removals and savings (extra [plot])")
    b.set_defaults(func=cmd_backtest)


def _emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="rightsizer", description="Stop paying for idle GPUs on EKS.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="decide on a snapshot (never acts)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--snapshot", metavar="DIR", help="a snapshot directory (README: 'Capturing a snapshot')"
    )
    src.add_argument("--config", metavar="FILE", help="a config file for live collection")
    p.add_argument("--policy", metavar="FILE", help="policy YAML (overrides the config's policy)")
    p.add_argument("--at", metavar="TIME", help="decision time, RFC 3339 with offset (default: taken_at)")
    p.add_argument("--json", action="store_true", help="print the Plan JSON document")
    p.set_defaults(func=cmd_plan)

    s = sub.add_parser("snapshot", help="record the live cluster as a snapshot directory (never acts)")
    s.add_argument(
        "--config", metavar="FILE", required=True, help="the config file (README: 'Configuration file')"
    )
    s.add_argument("--out", metavar="DIR", required=True, help="new (or empty) directory to write")
    s.add_argument("--at", metavar="TIME", help="snapshot time, RFC 3339 with offset (default: now)")
    s.set_defaults(func=cmd_snapshot)

    ap = sub.add_parser(
        "apply",
        help="plan live; drain the chosen idle nodes, resize opted-in instances, replace opted-in node groups "
        "(dry run unless --execute)",
    )
    ap.add_argument(
        "--config", metavar="FILE", required=True, help="the config file (README: 'Configuration file')"
    )
    ap.add_argument("--policy", metavar="FILE", help="policy YAML (overrides the config's policy)")
    ap.add_argument("--execute", action="store_true", help="act for real (also needs dry_run: false)")
    ap.add_argument("--json", action="store_true", help="print the outcome as one JSON document")
    ap.set_defaults(func=cmd_apply)

    sv = sub.add_parser(
        "savings", help="realized savings from the ledger, per day and node group (never acts)"
    )
    sv.add_argument(
        "--config", metavar="FILE", required=True, help="the config file (README: 'Configuration file')"
    )
    sv.add_argument("--json", action="store_true", help="print the report as one JSON document")
    sv.set_defaults(func=cmd_savings)

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
    ):
        c = sub.add_parser(name, help=helptext + " (never acts)")
        c.add_argument(
            "--stack", metavar="NAME", help="a deployed CloudFormation stack (its outputs name the table)"
        )
        c.add_argument(
            "--region", metavar="REGION", help="the stack's region (default: the AWS environment's)"
        )
        c.add_argument("--config", metavar="FILE", help="a config file with aws.table instead of --stack")
        c.add_argument("--json", action="store_true", help="print one JSON document")
        if name == "status":
            c.add_argument(
                "--failures", type=count_arg, default=10, metavar="N", help="last N failures (default 10)"
            )
        else:
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
        a = sub.add_parser(action, help=helptext + " (with your AWS credentials)")
        a.add_argument("execution_id", metavar="EXECUTION_ID", help="the drain execution (in the request)")
        a.add_argument("--stack", metavar="NAME", help="a deployed CloudFormation stack")
        a.add_argument(
            "--region", metavar="REGION", help="the stack's region (default: the AWS environment's)"
        )
        a.add_argument("--config", metavar="FILE", help="a config file with aws.table instead of --stack")
        a.add_argument("--json", action="store_true", help="print one JSON document")
        if action == "snooze":
            a.add_argument(
                "--for", dest="duration", metavar="DURATION", help="e.g. 24h (default: approval_snooze)"
            )
        a.set_defaults(func=cmd_decide, action=action, duration=None)

    v = sub.add_parser("validate", help="check a config, a policy and the deploy parameters before deploying")
    v.add_argument("--config", metavar="FILE", help="a config file")
    v.add_argument("--policy", metavar="FILE", help="a policy file (e.g. the text of PolicyParameterName)")
    v.add_argument("--samconfig", metavar="FILE", help="samconfig.toml whose parameter_overrides to check")
    v.add_argument("--environment", default="default", help="samconfig environment (default: default)")
    v.add_argument("--template", default="template.yaml", metavar="FILE", help="the SAM template")
    v.set_defaults(func=cmd_validate)

    w = sub.add_parser("serve", help="the webhook handler behind a local HTTP server (127.0.0.1)")
    w.add_argument(
        "--config", metavar="FILE", required=True, help="the config file (README: 'Configuration file')"
    )
    w.add_argument(
        "--port", type=port_arg, default=8080, metavar="N", help="TCP port (default 8080; 0 = any free)"
    )
    w.add_argument("--execute", action="store_true", help="act for real (default: dry run)")
    w.set_defaults(func=cmd_serve)

    o = sub.add_parser("offhours", help="scale node groups to their off-hours schedules")
    o.add_argument("action", choices=["down", "up", "status"], help="converge down / up, or show status")
    o.add_argument(
        "--config", metavar="FILE", required=True, help="the config file (README: 'Configuration file')"
    )
    o.add_argument("--force", action="store_true", help="drain busy/underutilized nodes too (never unknown)")
    o.add_argument("--execute", action="store_true", help="act (default: dry run)")
    o.add_argument("--at", metavar="TIME", help="evaluate at TIME, RFC 3339 (dry run / status only)")
    o.add_argument("--json", action="store_true", help="print the report as one JSON document")
    o.set_defaults(func=cmd_offhours)

    _add_backtest_parser(sub)
    add_prices_parser(sub)

    d = sub.add_parser("demo", help="run the main job on the embedded default")
    d.add_argument("--json", action="store_true", help="print the outcome as JSON")
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rightsizer`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logsafety.install()  # -v is our debug, never the SDKs'; no handler prints a credential
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"rightsizer: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RightsizerError as exc:
        print(f"rightsizer: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return code


if __name__ == "__main__":
    raise SystemExit(main())
