"""Backtest benchmark (issue 8): the packaged Alibaba GenAI 2026 trace, activity-only.

Runs, on the shipped trace (143 inference pods as single-GPU g5.xlarge nodes, 57 s samples, 22.8 h):

* the default policy (it protects GPU holders, so it saves nothing here, by design);
* the scale-to-zero policy (``evict_idle_gpu_holders: true``, ``max_nodes_per_run: 1000``);
* a sweep of the scale-to-zero policy's ``idle_window`` (default 10m, 20m, 30m, 60m, 2h);
* the request-based and naive-threshold baselines and the oracle,

and prints, per run: share of oracle, removals, regrets, unserved GPU-minutes, USD saved and wall time;
per idle window W: the ceiling (share of idle time inside idle runs longer than W), the reachable share
(Σ max(0, run − W) ÷ idle time) and how much of the ceiling the policy got. Usage:
``.venv/bin/python benchmarks/backtest_trace.py [--windows 10m,20m,30m,60m,2h] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rightsizer.backtest import simulate as bt
from rightsizer.backtest.report import (
    SCALE_TO_ZERO,
    BacktestRequest,
    NamedPolicy,
    Sweep,
    report_json,
    run_backtest,
    scale_to_zero_policy,
)
from rightsizer.backtest.sources import packaged_trace, read_trace
from rightsizer.domain.policy import Policy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", default="10m,20m,30m,60m,2h")
    parser.add_argument("--json", action="store_true", help="print the backtest JSON document instead")
    args = parser.parse_args()
    windows = [w.strip() for w in args.windows.split(",") if w.strip()]

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    source = read_trace(packaged_trace())
    read_s = time.perf_counter() - t0
    request = BacktestRequest(
        (NamedPolicy("default", Policy()), NamedPolicy(SCALE_TO_ZERO, scale_to_zero_policy())),
        sweep=Sweep("idle_window", tuple(windows)),
        sweep_base=SCALE_TO_ZERO,
    )
    report = run_backtest(source, request)
    if args.json:
        print(json.dumps(report_json(report), indent=2))
        return

    prep = report.prepared
    pod_days = sum(b - a for t in prep.tracks.values() for a, b in t.present) / 86400
    runs = bt.idle_run_lengths(prep)
    runs_min = sorted(x / 60 for x in runs)
    print(f"trace: {source.description} [{report.basis}]")
    print(
        f"read {read_s:.1f} s, indexed {report.prepare_seconds:.1f} s; "
        f"do nothing pays {prep.paid_gpu_hours:.1f} GPU-h, {prep.oracle_gpu_hours:.1f} idle; "
        f"{len(runs)} idle runs, median {statistics.median(runs_min):.1f} min, "
        f"p90 {runs_min[int(0.9 * (len(runs_min) - 1))]:.1f} min; {pod_days:.1f} pod-days"
    )
    print()
    header = (
        f"{'run':<22}{'of oracle':>10}{'USD saved':>11}{'removals':>10}{'regrets':>15}"
        f"{'unserved GPU-min':>18}{'wall s':>8}"
    )
    print(header)

    def line(name: str, row: object) -> None:
        f = row.figures  # type: ignore[attr-defined]
        share = "-" if f.share_of_oracle is None else f"{100 * f.share_of_oracle:.1f}%"
        rate = f"{100 * f.regrets / f.removals:.0f}%" if f.removals and f.kind != "oracle" else "-"
        print(
            f"{name:<22}{share:>10}{f.usd_saved:>11,.2f}{f.removals:>10}{f'{f.regrets} ({rate})':>15}"
            f"{f.unserved_gpu_minutes:>18.0f}{row.wall_seconds:>8.1f}"  # type: ignore[attr-defined]
        )

    for row in report.rows:
        line(row.figures.name, row)
    print()
    print(
        f"{'idle_window':<12}{'ceiling':>9}{'reachable':>11}{'of oracle':>11}{'of ceiling':>12}"
        f"{'removals':>10}{'regret rate':>13}{'re-adds':>9}{'unserved':>10}{'USD saved':>11}{'wall s':>8}"
    )
    for row in report.sweep_rows:
        f, c = row.figures, row.ceiling
        assert c is not None
        rate = f.regrets / f.removals if f.removals else 0.0
        print(
            f"{row.sweep_value:<12}{100 * c.share:>8.1f}%{100 * c.reachable:>10.1f}%"
            f"{100 * (f.share_of_oracle or 0):>10.1f}%{100 * (row.share_of_ceiling or 0):>11.0f}%"
            f"{f.removals:>10}{100 * rate:>12.0f}%{f.readds:>9}{f.unserved_gpu_minutes:>10.0f}{f.usd_saved:>11,.2f}{row.wall_seconds:>8.1f}"
        )
    goal = [
        r.sweep_value
        for r in report.sweep_rows
        if (r.share_of_ceiling or 0) >= 0.9
        and r.figures.removals
        and r.figures.regrets / r.figures.removals <= 0.2
    ]
    print()
    print(
        "goal (>= 90% of the ceiling, regrets <= 20% of removals): "
        + (", ".join(str(g) for g in goal) if goal else "not met by any window")
    )
    evaluations = sum(r.figures.plan_evaluations for r in report.rows + report.sweep_rows)
    print(
        f"total wall time {report.wall_seconds:.1f} s, process CPU {time.process_time() - cpu0:.1f} s, "
        f"{evaluations} node evaluations by plan()"
    )


if __name__ == "__main__":
    main()
