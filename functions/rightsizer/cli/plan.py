"""``rightsizer plan | snapshot | apply | demo``: decide on a snapshot or the live cluster, record a snapshot, act
on a plan in process, and the whole loop on the embedded default (docs/architecture.md §5 "CLI")."""

from __future__ import annotations

import argparse
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    emit_json,
    now_on_step,
    parse_time,
    print_progress,
    read_policy_file,
)
from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.planner import plan as make_plan
from rightsizer.domain.policy import Policy
from rightsizer.render import render_plan, render_window
from rightsizer.services.warm_pools import WarmPoolReport

log = logging.getLogger("rightsizer")


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
        if at is not None:
            _check_recorded(snapshot, policy, at)
    result = make_plan(snapshot, policy, at)
    pools = warm_pools(config, policy) if args.config and config.offhours.node_groups else None
    window = _recommended_window(config) if args.config and config.aws.table else None
    if args.json:
        document = result.to_json_dict()
        if pools is not None:
            document["warm_pools"] = [r.to_json() for r in pools]
        if window is not None:  # like warm_pools: present only when known, so a live plan and its
            document["recommended_window"] = window  # snapshot's replay stay one document
        emit_json(document)
    else:
        print(render_plan(result))
        if window is not None:
            print("\n" + render_window(window))
        if pools is not None:
            print("\n".join(render_warm_pools(pools)))
    return EXIT_OK


def _check_recorded(snapshot: ClusterSnapshot, policy: Policy, at: datetime) -> None:
    """Refuse a ``--at`` whose idle window (``at`` − ``policy.idle_window``, ``at``] shares no instant with
    the metrics the snapshot recorded, [``taken_at`` − ``window_seconds``, ``taken_at``]: every node would
    come out ``unknown`` for want of a sample. An ``at`` inside the recorded span decides as before.

    Raises:
        ConfigError: field ``--at``, naming the recorded window and the instants that can be answered.
    """
    meta = snapshot.meta
    start = meta.taken_at - timedelta(seconds=meta.window_seconds)
    until = meta.taken_at + timedelta(seconds=policy.idle_window)
    if start <= at < until:
        return

    def z(t: datetime) -> str:
        return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    raise ConfigError(
        f"{z(at)} is outside what this snapshot recorded: metrics from {z(start)} to {z(meta.taken_at)} "
        f"(taken_at); with idle_window {policy.idle_window}s pass --at from {z(start)} to before {z(until)}, "
        "or omit --at to decide at taken_at",
        field="--at",
    )


def _recommended_window(config: Config) -> dict[str, Any] | None:
    """The window a backtest on this cluster's history recorded in its state (``services.status``)."""
    from rightsizer.services.status import recommended_window
    from rightsizer.wiring import Runtime

    return recommended_window(Runtime(config, "cli").state.entries())


def warm_pools(
    config: Config, policy: Policy, *, apply: bool = False, acting: bool = False
) -> list[WarmPoolReport]:
    """The warm pool recommendation (and, with ``apply``, its setting) for the config's off-hours groups
    (``rightsizer.services.warm_pools``): EKS ``DescribeNodegroup``, ``DescribeWarmPool`` and, to apply,
    ``UpdateNodegroupConfig``, with the caller's credentials."""
    from rightsizer.domain.catalog import load_catalog
    from rightsizer.services.warm_pools import warm_pool_reports
    from rightsizer.wiring import Runtime
    from rightsizer.wiring.builders import build_warm_pools

    if not config.cluster.name:
        raise ConfigError("warm pools need the EKS cluster name", field="cluster.name")
    state = Runtime(config, "cli").state
    return warm_pool_reports(
        build_warm_pools(config), cluster=config.cluster.name, offhours=config.offhours, policy=policy,
        catalog=load_catalog(), saved=state, entries=state.entries(), now=datetime.now(UTC), apply=apply,
        acting=acting,
    )  # fmt: skip


def render_warm_pools(reports: list[WarmPoolReport]) -> list[str]:
    """Text lines: per off-hours group, the recommendation with its figures, drift and what was applied."""
    lines = ["", "Warm pools (off-hours node groups):"]
    for r in reports:
        if r.error is not None:
            lines.append(f"  {r.node_group}: error: {r.error}")
            continue
        assert r.recommendation is not None
        lines.append(f"  {r.node_group}: {r.recommendation.reason()}")
        if r.recommendation.config is not None:
            lines.append(f"    warmPoolConfig {r.recommendation.config}")
        for d in r.drift:
            lines.append(f"    drift: {d}")
        if r.applied is not None:
            lines.append(f"    apply: {r.applied}")
    return lines


def _observe_live(config: Config, policy: Policy, at: datetime | None) -> ClusterSnapshot:
    """Observe the configured cluster at ``at`` (default now) into an in-memory ``ClusterSnapshot``
    whose GPU signals are aggregated in Prometheus (``collect_live``)."""
    from rightsizer.wiring import PolicyProvider, Runtime

    runtime = Runtime(config, "cli", policy=PolicyProvider.fixed(policy))
    return runtime.observe_fresh(at or now_on_step(config.prometheus.step), floor=False)


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``rightsizer snapshot``: record the live cluster as a snapshot directory (docs/architecture.md §5); never acts.

    Lists are read page by page and written object by object, metrics answers one at a time: memory does
    not grow with the number of objects (docs/architecture.md §8).
    """
    from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter, require_free_output
    from rightsizer.services.observe import observe_request
    from rightsizer.services.snapshot import record
    from rightsizer.wiring import Runtime

    config = load_config(args.config)
    at = parse_time(args.at) if args.at else now_on_step(config.prometheus.step)
    require_free_output(args.out)  # refuse bad input before contacting anything; the writer re-checks
    request = observe_request(config, config.policy, at)
    observers = Runtime(config, "cli").observers
    # The policy's node_selector keys stay on the nodes, so the snapshot selects the nodes it selected.
    keep = tuple(config.policy.node_selector)
    with SnapshotDirectoryWriter(
        args.out,
        policy_node_labels=keep,
        node_label=config.prometheus.node_label,
        policy_pod_labels=(config.policy.showback_team_label,),
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
    runtime = Runtime(config, "cli", dry_run=not args.execute, progress=print_progress)
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
    pools = (
        warm_pools(config, config.policy, apply=True, acting=not dry_run)
        if config.policy.allow_warm_pool and config.offhours.node_groups
        else None
    )
    if pools is not None:
        document["warm_pools"] = [r.to_json() for r in pools]
    if args.json:
        emit_json(document)
    else:
        print(
            f"apply ({'dry run' if dry_run else 'EXECUTE'}): verdicts {summary.verdicts}, {len(finals)} drain(s)"
        )
        for eid, r in finals.items():
            print(f"  {eid}: {r.status if r else 'not run'} {r.message if r else ''}")
        for workload, result in summary.workloads.items():  # workloads.scale_to_zero (docs/workloads.md)
            print(f"  {workload}: {result}")
        if pools is not None:
            print("\n".join(render_warm_pools(pools)))
    failed = [r for r in finals.values() if r is None or r.status in ("failed", "rolled_back")]
    failed_pools = [r for r in pools or [] if r.error is not None]
    return EXIT_FAILED if failed or failed_pools else EXIT_OK


def add_parsers(sub: Any) -> None:
    """Register ``plan``, ``snapshot``, ``apply`` and ``demo``."""

    p = sub.add_parser(
        "plan",
        help="decide on a snapshot or on the live cluster (never acts)",
        description="Decide on a snapshot directory (--snapshot) or on the live cluster (--config); never acts.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--snapshot", metavar="DIR", help="a snapshot directory (docs/operations.md: 'Capturing a snapshot')"
    )
    src.add_argument("--config", metavar="FILE", help="a config file for live collection")
    p.add_argument("--policy", metavar="FILE", help="policy YAML (overrides the config's policy)")
    p.add_argument("--at", metavar="TIME", help="decision time, RFC 3339 with offset (default: taken_at)")
    p.add_argument("--json", action="store_true", help="print the Plan JSON document")
    p.set_defaults(func=cmd_plan)

    s = sub.add_parser("snapshot", help="record the live cluster as a snapshot directory (never acts)")
    s.add_argument(
        "--config",
        metavar="FILE",
        required=True,
        help="the config file (docs/policy.md: 'Configuration file')",
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
        "--config",
        metavar="FILE",
        required=True,
        help="the config file (docs/policy.md: 'Configuration file')",
    )
    ap.add_argument("--policy", metavar="FILE", help="policy YAML (overrides the config's policy)")
    ap.add_argument("--execute", action="store_true", help="act for real (also needs dry_run: false)")
    ap.add_argument("--json", action="store_true", help="print the outcome as one JSON document")
    ap.set_defaults(func=cmd_apply)
    d = sub.add_parser("demo", help="run the main job on the embedded default")
    d.add_argument("--json", action="store_true", help="print the outcome as JSON")
    d.set_defaults(func=cmd_demo)
