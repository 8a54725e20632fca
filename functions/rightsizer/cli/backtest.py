"""``rightsizer backtest``: price policies on history before turning them on (never acts)."""

from __future__ import annotations

import argparse
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from rightsizer.cli.common import EXIT_OK, emit_json, parse_time, read_policy_file
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
        emit_json(report_json(report))
    else:
        print(render_report(report))
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
    b.add_argument("--provision-delay", default="5m", help="time to add a node back (default 5m)")
    b.add_argument("--regret-horizon", default="30m", help="a removal regrets within this (default 30m)")
    b.add_argument(
        "--activity-threshold", type=float, default=5.0, metavar="PCT", help="active above (default 5)"
    )
    b.add_argument(
        "--instance-type",
        metavar="TYPE",
        help="trace nodes' type (default g5.xlarge); Prometheus nodes without a type label",
    )
    b.add_argument("--json", action="store_true", help="print the report as one JSON document")
    b.add_argument("--plot", metavar="FILE.png", help="draw activity, removals and savings (extra [plot])")
    b.set_defaults(func=cmd_backtest)
