"""``rightsizer backtest``: price policies on history before turning them on (never acts).

The command's flags and wiring; the simulation is :mod:`rightsizer.backtest.simulate`, the report
:mod:`rightsizer.backtest.report`, the frontier (the window chosen by price) :mod:`rightsizer.backtest.frontier`.
"""

from __future__ import annotations

import argparse
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from rightsizer.cli.common import EXIT_OK, emit_json, parse_time, percent_arg, read_policy_file
from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.policy import Policy

log = logging.getLogger("rightsizer")


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


def measured_provision_delay(config: Config, *, warm: bool = False) -> int:
    """The cluster's measured restore delay in seconds: the p50 (nearest rank) of desired-size change →
    first GPU pod Ready (GPUs allocatable when no GPU pod came) over the scale-outs recorded in its
    ledger (``rightsizer.domain.restore_timing``); ``warm`` = only those served from a warm pool.

    Raises:
        ConfigError: nothing measured yet (field ``--provision-delay``).
    """
    from rightsizer.domain.restore_timing import nearest_rank
    from rightsizer.services.restore_timing import recorded_timings
    from rightsizer.wiring import Runtime

    timings = recorded_timings(Runtime(config, "cli").state.entries())
    serving = [
        s
        for t in timings
        if t.complete and (t.start == "warm") == warm and (s := t.serving_seconds) is not None
    ]
    p50 = nearest_rank(serving, 0.5)
    if p50 is None:
        kind = "warm-pool " if warm else "cold "
        raise ConfigError(
            f"no {kind}scale-out of this cluster has been measured yet (off-hours restores and scale-outs "
            "after a removal record one); pass a duration instead",
            field="--warm-pool-delay" if warm else "--provision-delay",
        )
    return round(p50)


def _delay(text: str, flag: str, args: argparse.Namespace, *, warm: bool) -> int:
    from rightsizer.backtest.report import parse_seconds

    if text.strip().lower() != "measured":
        return parse_seconds(text, flag)
    if not args.config:
        raise ConfigError(f"{flag} measured needs --config FILE (the deployment's state)", field=flag)
    return measured_provision_delay(load_config(args.config), warm=warm)


def _record_window(config: Config, chosen: Any, start: float, end: float) -> None:
    """Record the best window of a backtest on the cluster's own history in its ledger (kind
    ``backtest``, step ``recommended_window``), so ``status`` and ``plan --config`` show it."""
    from datetime import UTC

    from rightsizer.backtest.frontier import recommendation_reason
    from rightsizer.state import LedgerEntry
    from rightsizer.wiring import Runtime

    reason = recommendation_reason(chosen, start, end)
    if reason is None:
        return
    now = datetime.now(UTC)
    Runtime(config, "cli").state.record(
        LedgerEntry(
            execution_id=f"backtest-{now.strftime('%Y%m%dT%H%M%SZ')}", node=None, instance_id=None,
            node_group=None, kind="backtest", step="recommended_window", result="applied", reason=reason,
            hourly_savings_usd=None, monthly_savings_usd=None, at=now,
        )
    )  # fmt: skip
    log.info("recommended %s recorded in the cluster's state", reason)


def cmd_backtest(args: argparse.Namespace) -> int:
    """``rightsizer backtest``: replay history through the same ``plan()`` for each policy, beside the
    request-based and naive-threshold baselines and the oracle; with ``--sweep idle_window=…`` also the
    frontier (billed USD saved vs unserved GPU-minutes per window, cold and with ``--warm-pool-delay``)
    and the best window at the policy's ``unserved_gpu_minute_usd``. Never acts."""
    from rightsizer.backtest.frontier import frontier, frontier_json, render_frontier
    from rightsizer.backtest.report import (
        SCALE_TO_ZERO,
        WORKLOAD_SCALE_TO_ZERO,
        BacktestRequest,
        NamedPolicy,
        Sweep,
        parse_seconds,
        render_report,
        report_json,
        run_backtest,
        scale_to_zero_policy,
        workload_scale_to_zero_policy,
    )
    from rightsizer.backtest.simulate import SimModel, WarmPoolModel

    if args.plot:
        from rightsizer.backtest.plot import check_plot_target

        check_plot_target(args.plot)  # before the replay, not after minutes of it
    price = args.unserved_gpu_minute_usd
    if price is not None and price < 0:
        raise ConfigError("the price cannot be negative", field="--unserved-gpu-minute-usd")
    sweep = Sweep.parse(args.sweep) if args.sweep else None
    # Everything the user typed is checked before the history is read (minutes from a trace or Prometheus):
    # the sweep's key and values, and the policy files.
    if sweep is not None:
        for value in sweep.values:
            sweep.variant(Policy(), value)
    extra = [(Path(path).stem, read_policy_file(path)) for path in args.policy or []]
    model = SimModel(
        step=parse_seconds(args.step, "--step"),
        provision_delay=_delay(args.provision_delay, "--provision-delay", args, warm=False),
        regret_horizon=parse_seconds(args.regret_horizon, "--regret-horizon"),
        activity_threshold_pct=float(args.activity_threshold),
    )
    if model.step <= 0:
        raise ConfigError("the step must be positive", field="--step")
    warm_pool = None
    if args.warm_pool_delay:
        delay = _delay(args.warm_pool_delay, "--warm-pool-delay", args, warm=True)
        warm_pool = WarmPoolModel.of(args.warm_pool_state, delay, volume_gb=args.warm_pool_volume_gb)
    source, config = _backtest_source(args)
    policies: list[NamedPolicy] = []
    base: str | None = None
    if source.kind == "trace":
        # The trace's pods hold their GPUs: the default policy protects them (saves nothing, by design);
        # scale-to-zero is the policy this trace can price.
        policies += [
            NamedPolicy("default", Policy()),
            NamedPolicy(SCALE_TO_ZERO, scale_to_zero_policy()),
            NamedPolicy(WORKLOAD_SCALE_TO_ZERO, workload_scale_to_zero_policy()),  # issue 32
        ]
        base = SCALE_TO_ZERO
    else:
        policies.append(NamedPolicy("config" if config else "default", config.policy if config else Policy()))
        base = policies[0].name
    for stem, policy in extra:
        name = stem
        taken = {p.name for p in policies}
        suffix = 2
        while name in taken:
            name, suffix = f"{stem}-{suffix}", suffix + 1
        policies.append(NamedPolicy(name, policy))
        base = name
    request = BacktestRequest(tuple(policies), model, sweep, base, warm_pool=warm_pool)
    report = run_backtest(source, request)
    chosen = frontier(report, price)
    if chosen is not None and source.kind == "prometheus" and config is not None and config.aws.table:
        _record_window(config, chosen, source.history.start, source.history.end)
    if args.plot:
        from rightsizer.backtest.plot import plot_report

        log.info("plot written to %s", plot_report(report, args.plot, chosen))
    if args.json:
        doc = report_json(report)
        doc["frontier"] = None if chosen is None else frontier_json(chosen)
        emit_json(doc)
    else:
        print(render_report(report))
        if chosen is not None:
            print("\n".join(render_frontier(chosen)))
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Register ``backtest``."""
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
    b.add_argument(
        "--provision-delay",
        default="5m",
        help="desired-size change to first GPU pod Ready (default 5m); 'measured': the p50 the "
        "deployment recorded (needs --config)",
    )
    b.add_argument(
        "--warm-pool-delay",
        metavar="DURATION|measured",
        help="also run every sweep point with a warm pool restoring in this time",
    )
    b.add_argument(
        "--warm-pool-state",
        choices=("STOPPED", "RUNNING"),
        default="STOPPED",
        help="pooled instances stopped (EBS cost only, default) or running (full price)",
    )
    b.add_argument(
        "--warm-pool-volume-gb", type=float, default=100.0, help="EBS GB per pooled instance (default 100)"
    )
    b.add_argument(
        "--unserved-gpu-minute-usd",
        type=float,
        metavar="USD",
        help="price of an unserved GPU-minute for the frontier (default: the policy's)",
    )
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
    b.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw activity, removals, savings, the frontier and regrets (extra [plot])",
    )
    b.set_defaults(func=cmd_backtest)
